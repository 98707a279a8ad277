//! The registry of Keras layer classes: `registry!`, invoked once in `layers/mod.rs` with one line
//! per type (its file, and the classes it reads, runs and writes; classes that differ by one
//! argument share a type, which tells them apart by [`Build::class`]), and what [`Layer`] does
//! with it. The supported-classes list of errors, `--help` and README comes from here
//! ([`supported_classes`]).

use std::path::Path;

use burn::tensor::Device;

use super::{Build, CLASSES, Call, KerasLayer, Layer, Variable};
use crate::config::LayerArgs;
use crate::graph::LayerSpec;
use crate::ops::OperationNode;
use crate::saved::SavedWeights;
use crate::torch::{TorchCall, TorchModule};
use crate::value::Value;
use model::error::{ModelError, Result};

/// Declares the class modules, [`Layer`] (one variant per type, plus operation nodes),
/// [`CLASSES`], and the dispatch from a class name to its type. Invoked once, in `layers/mod.rs`:
/// `module::Type => "Class", "OtherClass";` per type.
macro_rules! registry {
    ($($module:ident :: $type:ident => $($class:literal),+;)*) => {
        $(pub mod $module;)*

        /// A layer of the model, as its Keras class: a Burn module (its variables are parameters)
        /// or a step without variables.
        #[derive(burn::module::Module, Debug)]
        #[allow(clippy::large_enum_variant)] // one per layer of a model, built once
        pub enum Layer {
            $($type($module::$type),)*
            /// An operation node (`x + y`, `keras.ops.mean(x)`).
            Operation($crate::ops::OperationNode),
        }

        /// Every layer class this converter builds, in the registry's order.
        pub const CLASSES: &[&str] = &[$($($class),+),*];

        impl Layer {
            /// The layer of class `class`, or `None` for a class outside the registry.
            fn of_class(class: &str, build: &mut Build) -> Option<Result<Self>> {
                match class {
                    $($($class)|+ => Some(<$module::$type as KerasLayer>::build(build).map(Self::$type)),)*
                    _ => None,
                }
            }

            /// The layer as its class.
            fn class(&self) -> &dyn KerasLayer {
                match self {
                    $(Self::$type(layer) => layer,)*
                    Self::Operation(op) => op,
                }
            }
        }
    };
}

/// The supported classes as one line, for errors, `--help` and README.
pub fn supported_classes() -> String {
    format!("{}, and keras.ops operations", CLASSES.join(", "))
}

impl Layer {
    /// The layer described by `spec`, its variables read from `saved`; `place` says where it sits
    /// in the graph, for the error on a class outside the registry.
    pub fn build(file: &Path, spec: &LayerSpec, saved: &SavedWeights, device: &Device, place: &str) -> Result<Self> {
        let args = LayerArgs::new(file, &spec.name, &spec.class_name, &spec.config);
        let mut build = Build { file, spec, args, saved, device };
        let layer = if spec.is_operation() {
            Self::Operation(OperationNode::build(&mut build)?)
        } else {
            match spec.is_known_class().then(|| Self::of_class(&spec.class_name, &mut build)).flatten() {
                Some(layer) => layer?,
                None => return Err(unsupported(file, spec, place)),
            }
        };
        build.args.finish()?;
        Ok(layer)
    }

    /// Runs one call; the outputs carry their Keras masks.
    pub fn call(&self, call: &Call) -> Result<Vec<Value>> {
        self.class().call(call)
    }

    /// The variables in Keras' order and layout.
    pub fn variables(&self) -> Vec<Variable> {
        self.class().variables()
    }

    /// Whether a call takes the masks off its input tensors.
    pub fn clears_input_masks(&self) -> bool {
        self.class().clears_input_masks()
    }

    /// The layer's attribute of the generated torch module, and its state dict.
    pub fn torch_module(&self, module: &mut TorchModule) -> Result<()> {
        self.class().torch_module(module)
    }

    /// The statements of one call in the generated `forward`.
    pub fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        self.class().torch_call(call)
    }
}

/// The error for a class outside the registry: its name, class and place in the graph.
fn unsupported(file: &Path, spec: &LayerSpec, place: &str) -> ModelError {
    let kind = match spec.class_name.as_str() {
        "Lambda" => "a Lambda layer (Python code, which a file cannot carry)".to_string(),
        "StringLookup" | "TextVectorization" | "IntegerLookup" | "Hashing" => format!(
            "{} preprocessing of strings, which Burn and the torch module do not take: build the model from \
             the layer's output (token ids) on, feed it the ids, and keep {} in your data pipeline",
            spec.class_name, spec.class_name
        ),
        _ if !spec.is_known_class() => format!(
            "a custom layer (registered as {:?}), whose Python code a file does not carry. \
             `cargo xtask flatten FILE --import YOUR_LAYERS.py --out FLAT.keras` re-traces custom layers \
             into built-in ones, with your Python and Keras",
            spec.registered_name.as_deref().unwrap_or(&spec.class_name)
        ),
        class => format!("a layer class this converter does not support ({class})"),
    };
    ModelError::file(
        file,
        format!(
            "layer {} ({}, {place}) is {kind}. Supported: {}. `cargo xtask convert FILE --layer NAME` still converts the file's attention layers one by one",
            spec.name,
            spec.class_name,
            supported_classes()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::super::CLASSES;

    /// README's list of layer classes is the registry's: the paragraph after the line that
    /// introduces it, the classes in backticks, in the registry's order.
    #[test]
    fn readme_lists_the_registry() {
        let readme = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"));
        let start = readme.find("Layer classes (the `registry!`").expect("README introduces the layer classes");
        let listed: String =
            readme[start..].lines().skip(1).take_while(|l| !l.trim().is_empty()).collect::<Vec<_>>().join(" ");
        let expected = format!("{}.", CLASSES.iter().map(|c| format!("`{c}`")).collect::<Vec<_>>().join(", "));
        assert_eq!(
            listed, expected,
            "README's layer classes differ from the registry (`python3 xtask/python/readme_layer_classes.py` rewrites them); the list should read:\n{expected}"
        );
    }
}
