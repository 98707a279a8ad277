//! The prelude (`prelude.py`): the Keras semantics torch has no built-in for, written once, of
//! which a generated module carries only what its code reads.
//!
//! The prelude is cut into top-level definitions (a `def`, a `class`, a constant, each with the
//! comment above it); a definition is kept when the module's own code, or a kept definition,
//! names it. A time-series Transformer's module carries `Conv1D`, `MultiHeadAttention`,
//! `dropout` and what they call, not the recurrent layers or the image resizing.

use std::collections::HashSet;

const PRELUDE: &str = include_str!("prelude.py");

/// One top-level definition of the prelude: the name it defines and its text (with the comment
/// lines above it and the blank lines after it).
struct Definition {
    name: &'static str,
    text: &'static str,
}

/// The prelude's head (imports, `HERE`, `keep_freed_memory`, down to the banner that opens the
/// Keras semantics), which every module keeps, and the definitions after it in order.
fn definitions() -> (&'static str, Vec<Definition>) {
    let banner = PRELUDE.rfind("\n# ---").map_or(0, |at| at + 1);
    let starts: Vec<usize> =
        line_starts(PRELUDE).filter(|&at| at > banner && defined_name(&PRELUDE[at..]).is_some()).collect();
    // A definition begins at the comment run directly above its first line.
    let begin = |at: usize| {
        let mut begin = at;
        for previous in PRELUDE[..at].lines().rev() {
            if !previous.starts_with('#') {
                break;
            }
            begin -= previous.len() + 1;
        }
        begin
    };
    let begins: Vec<usize> = starts.iter().map(|&at| begin(at)).collect();
    let head = &PRELUDE[..begins.first().copied().unwrap_or(PRELUDE.len())];
    let definitions = starts
        .iter()
        .zip(&begins)
        .enumerate()
        .map(|(k, (&at, &begin))| Definition {
            name: defined_name(&PRELUDE[at..]).unwrap_or_default(),
            text: &PRELUDE[begin..begins.get(k + 1).copied().unwrap_or(PRELUDE.len())],
        })
        .collect();
    (head, definitions)
}

fn line_starts(text: &str) -> impl Iterator<Item = usize> + '_ {
    std::iter::once(0).chain(text.match_indices('\n').map(|(at, _)| at + 1)).filter(move |&at| at < text.len())
}

/// The name a top-level line defines: `def f(`, `class C(`, `NAME = `, or an import's name.
fn defined_name(line: &str) -> Option<&str> {
    let line = line.lines().next().unwrap_or_default();
    if let Some(rest) = line.strip_prefix("def ").or_else(|| line.strip_prefix("class ")) {
        identifiers(rest).next()
    } else if line.starts_with("import ") || line.starts_with("from ") {
        line.split_whitespace().last() // `import math`, `... as F`, `from m import load_file`
    } else if line.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') && line.contains(" = ") {
        identifiers(line).next() // `HERE = ...`, `ACTIVATIONS = {`
    } else {
        None
    }
}

/// The identifiers of some Python code (and of its strings: a definition named only in a
/// docstring is kept too, which costs lines, never correctness).
fn identifiers(code: &str) -> impl Iterator<Item = &str> {
    code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_'))
}

/// The names the prelude defines at its top level (imports, functions, classes, constants),
/// which `forward` calls by name.
pub fn prelude_names() -> HashSet<&'static str> {
    let (head, definitions) = definitions();
    head.lines().filter_map(defined_name).chain(definitions.iter().map(|d| d.name)).collect()
}

/// The prelude as a module whose own code is `code` carries it: the head, and each definition
/// that `code` or a carried definition names, in the prelude's order.
pub fn prelude_for(code: &str) -> String {
    let (head, definitions) = definitions();
    let mut named: HashSet<&str> = identifiers(code).collect();
    let mut kept = vec![false; definitions.len()];
    // Until nothing more is named: a kept definition may name one above or below it.
    loop {
        let before = named.len();
        for (definition, kept) in definitions.iter().zip(kept.iter_mut()) {
            if !*kept && named.contains(definition.name) {
                *kept = true;
                named.extend(identifiers(definition.text));
            }
        }
        if named.len() == before {
            break;
        }
    }
    let mut prelude = head.to_string();
    for (definition, _) in definitions.iter().zip(&kept).filter(|(_, kept)| **kept) {
        prelude.push_str(definition.text);
    }
    prelude.trim_end().to_string()
}

/// The defaults a prelude function or class (its `__init__`) gives its parameters, as written
/// in its signature: `[("strides", "1"), ("padding", "\"valid\""), ...]` for `Conv1D`; none
/// for a name the prelude does not define.
pub fn parameter_defaults(function: &str) -> Vec<(&'static str, &'static str)> {
    let signature = PRELUDE.find(&format!("\ndef {function}(")).or_else(|| {
        let class = PRELUDE.find(&format!("\nclass {function}("))?;
        PRELUDE[class..].find("\n    def __init__(").map(|at| class + at)
    });
    let Some(at) = signature else { return Vec::new() };
    let open = at + PRELUDE[at..].find('(').unwrap_or(0) + 1;
    // The parameters: split at the commas outside brackets, up to the signature's closing one.
    let (mut depth, mut start, mut parameters) = (0usize, open, Vec::new());
    for (offset, c) in PRELUDE[open..].char_indices() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' if depth > 0 => depth -= 1,
            ',' | ')' if depth == 0 => {
                parameters.push(PRELUDE[start..open + offset].trim());
                start = open + offset + 1;
                if c == ')' {
                    break;
                }
            }
            _ => {}
        }
    }
    parameters.iter().filter_map(|p| p.split_once('=')).map(|(name, default)| (name.trim(), default.trim())).collect()
}

/// The whole prelude, for tests that read it.
#[cfg(test)]
pub fn whole() -> &'static str {
    PRELUDE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prelude_s_names_are_read_from_it() {
        let names = prelude_names();
        for name in ["math", "F", "load_file", "HERE", "ACTIVATIONS", "dropout", "softplus", "Conv1D", "Recurrent"] {
            assert!(names.contains(name), "{name} missing from {names:?}");
        }
        assert!(!names.contains("x") && !names.contains("self") && !names.contains(""), "{names:?}");
    }

    #[test]
    fn the_definitions_cut_the_prelude_without_losing_a_line() {
        let (head, definitions) = definitions();
        let joined: String = std::iter::once(head).chain(definitions.iter().map(|d| d.text)).collect();
        assert_eq!(joined, PRELUDE);
        assert!(head.contains("import torch") && head.contains("def keep_freed_memory("), "{head}");
        assert!(head.trim_end().ends_with(
            "# ---------------------------------------------------------------------------------------------"
        ));
        let activations = definitions.iter().find(|d| d.name == "ACTIVATIONS").expect("ACTIVATIONS");
        assert!(activations.text.starts_with("# Keras' activations by name"), "{}", activations.text);
    }

    #[test]
    fn defaults_are_read_from_a_function_s_or_a_class_s_signature() {
        let conv = parameter_defaults("Conv1D");
        assert_eq!(conv.first(), Some(&("strides", "1")), "{conv:?}");
        assert!(conv.contains(&("padding", "\"valid\"")) && conv.contains(&("activation", "\"linear\"")), "{conv:?}");
        assert!(!conv.iter().any(|(name, _)| *name == "in_channels" || *name == "self"), "{conv:?}");
        assert_eq!(parameter_defaults("dropout"), [("training", "False"), ("noise_shape", "None")]);
        let layer_norm = parameter_defaults("LayerNormalization");
        assert!(
            layer_norm.contains(&("axis", "(-1,)")) && layer_norm.contains(&("epsilon", "0.001")),
            "{layer_norm:?}"
        );
        assert!(parameter_defaults("nn.Linear").is_empty() && parameter_defaults("same_padding").is_empty());
    }

    #[test]
    fn a_module_carries_what_its_code_names_and_what_that_calls() {
        let prelude = prelude_for("x1 = dropout(x0, rate=0.25, training=self.training)");
        assert!(prelude.contains("def dropout(") && prelude.contains("def keras_dropout("), "{prelude}");
        assert!(!prelude.contains("class Recurrent(") && !prelude.contains("def resize("), "{prelude}");
        let prelude = prelude_for("self.conv = Conv1D(in_channels=4, filters=4, kernel_size=1)");
        for carried in ["class Conv1D(", "def same_padding(", "ACTIVATIONS = {", "def mish("] {
            assert!(prelude.contains(carried), "{carried} missing");
        }
        assert!(!prelude.contains("def dropout("), "{prelude}");
        assert_eq!(prelude_for(""), prelude_for("").trim_end());
        assert!(prelude_for("").contains("from safetensors.torch import load_file"));
    }
}
