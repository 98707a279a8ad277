//! A layer's constructor arguments from `config.json`, each one honoured or refused by name.
//!
//! A layer reads the arguments it implements with the `take_*` methods; [`LayerArgs::finish`]
//! then refuses every argument left over unless it cannot change what a trained layer computes
//! (initializers, regularizers, constraints, the name). A refusal names the layer, its class and
//! the argument, so a model is never run with an argument silently ignored.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value as Json;

use model::error::{ModelError, Result};

/// Arguments that never change a trained layer's output.
fn is_inert(name: &str, value: &Json) -> bool {
    matches!(name, "name" | "trainable" | "dtype" | "activity_regularizer" | "seed" | "autocast")
        || name.ends_with("_initializer")
        || name.ends_with("_regularizer")
        || name.ends_with("_constraint")
        // Quantization and LoRA are accepted only when off.
        || (matches!(name, "quantization_config" | "lora_rank" | "lora_alpha" | "gptq") && (value.is_null() || value == &Json::Bool(false)))
}

/// The arguments of one layer, with where it sits for errors.
pub struct LayerArgs<'a> {
    file: &'a Path,
    /// `layer <name> (<class>)`
    pub what: String,
    left: BTreeMap<String, Json>,
}

impl<'a> LayerArgs<'a> {
    pub fn new(file: &'a Path, name: &str, class: &str, config: &Json) -> Self {
        let left =
            config.as_object().map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()).unwrap_or_default();
        Self { file, what: format!("layer {name} ({class})"), left }
    }

    /// An error about this layer.
    pub fn error(&self, message: impl std::fmt::Display) -> ModelError {
        ModelError::file(self.file, format!("{}: {message}", self.what))
    }

    fn bad(&self, argument: &str, value: &Json, why: &str) -> ModelError {
        self.error(format!("{argument} = {value}: {why}"))
    }

    /// The argument's raw value, `Null` when absent.
    pub fn take(&mut self, argument: &str) -> Json {
        self.take_opt(argument).unwrap_or(Json::Null)
    }

    /// The argument's raw value, `None` when absent (an explicit `null` is `Some(Null)`).
    pub fn take_opt(&mut self, argument: &str) -> Option<Json> {
        self.left.remove(argument)
    }

    pub fn take_f64(&mut self, argument: &str, default: f64) -> Result<f64> {
        match self.take(argument) {
            Json::Null => Ok(default),
            v => v.as_f64().ok_or_else(|| self.bad(argument, &v, "not a number")),
        }
    }

    pub fn take_opt_f64(&mut self, argument: &str) -> Result<Option<f64>> {
        match self.take(argument) {
            Json::Null => Ok(None),
            v => v.as_f64().map(Some).ok_or_else(|| self.bad(argument, &v, "not a number")),
        }
    }

    pub fn take_usize(&mut self, argument: &str, default: Option<usize>) -> Result<usize> {
        match self.take(argument) {
            Json::Null => default.ok_or_else(|| self.error(format!("{argument} is missing"))),
            // Keras writes tuples of one for 1-D layers: `kernel_size: [3]`.
            Json::Array(items) if items.len() == 1 => {
                items[0].as_u64().map(|v| v as usize).ok_or_else(|| self.bad(argument, &items[0], "not a size"))
            }
            v => v.as_u64().map(|v| v as usize).ok_or_else(|| self.bad(argument, &v, "not a size")),
        }
    }

    pub fn take_opt_usize(&mut self, argument: &str) -> Result<Option<usize>> {
        match self.take(argument) {
            Json::Null => Ok(None),
            Json::Array(items) if items.len() == 1 => {
                items[0].as_u64().map(|v| Some(v as usize)).ok_or_else(|| self.bad(argument, &items[0], "not a size"))
            }
            v => v.as_u64().map(|v| Some(v as usize)).ok_or_else(|| self.bad(argument, &v, "not a size")),
        }
    }

    pub fn take_bool(&mut self, argument: &str, default: bool) -> Result<bool> {
        match self.take(argument) {
            Json::Null => Ok(default),
            v => v.as_bool().ok_or_else(|| self.bad(argument, &v, "not a boolean")),
        }
    }

    pub fn take_str(&mut self, argument: &str, default: &str) -> Result<String> {
        match self.take(argument) {
            Json::Null => Ok(default.to_string()),
            v => v.as_str().map(str::to_string).ok_or_else(|| self.bad(argument, &v, "not a string")),
        }
    }

    /// One of `allowed`, or an error listing them.
    pub fn take_choice(&mut self, argument: &str, default: &str, allowed: &[&str]) -> Result<String> {
        let value = self.take_str(argument, default)?.to_lowercase();
        if allowed.contains(&value.as_str()) {
            Ok(value)
        } else {
            Err(self.error(format!("{argument} = {value:?}: supported values are {allowed:?}")))
        }
    }

    /// An integer or a list of integers (axes, shapes); `None` when absent.
    pub fn take_ints(&mut self, argument: &str) -> Result<Option<Vec<i64>>> {
        match self.take(argument) {
            Json::Null => Ok(None),
            Json::Number(n) => {
                n.as_i64().map(|v| Some(vec![v])).ok_or_else(|| self.error(format!("{argument} = {n}: not an integer")))
            }
            Json::Array(items) => {
                let values: Option<Vec<i64>> = items.iter().map(Json::as_i64).collect();
                values.map(Some).ok_or_else(|| self.error(format!("{argument} = {items:?}: not a list of integers")))
            }
            v => Err(self.bad(argument, &v, "not an integer or a list of integers")),
        }
    }

    /// `(before, after)` amounts for each of `dims` spatial axes, as Keras standardises padding and
    /// cropping arguments: one integer for all, one per axis (the same before and after), or a
    /// pair per axis. For one axis (`ZeroPadding1D`), a list of two integers is its pair.
    pub fn take_pairs(&mut self, argument: &str, dims: usize, default: usize) -> Result<Vec<(usize, usize)>> {
        let value = self.take(argument);
        let bad = |why: &str| self.bad(argument, &value, why);
        let amount = |v: &Json| v.as_u64().map(|n| n as usize);
        let pair = |v: &Json| match v {
            Json::Array(items) if items.len() == 2 => Some((amount(&items[0])?, amount(&items[1])?)),
            v => amount(v).map(|n| (n, n)),
        };
        match &value {
            Json::Null => Ok(vec![(default, default); dims]),
            Json::Number(_) => pair(&value).map(|p| vec![p; dims]).ok_or_else(|| bad("not a non-negative integer")),
            Json::Array(items) if dims == 1 && items.len() == 2 && items.iter().all(Json::is_number) => {
                pair(&value).map(|p| vec![p]).ok_or_else(|| bad("not two non-negative integers"))
            }
            Json::Array(items) if items.len() == dims => items
                .iter()
                .map(pair)
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| bad("not an integer or a pair of integers per axis")),
            _ => Err(bad(&format!("not {dims} axis amounts"))),
        }
    }

    /// `data_format`: `true` for channels-last.
    pub fn take_channels_last(&mut self) -> Result<bool> {
        Ok(self.take_choice("data_format", "channels_last", &["channels_last", "channels_first"])? == "channels_last")
    }

    /// Marks every argument as read (a layer whose own reader checked them all).
    pub fn take_all(&mut self) {
        self.left.clear();
    }

    /// Refuses what no `take_*` consumed, unless inert.
    pub fn finish(self) -> Result<()> {
        for (argument, value) in &self.left {
            if !is_inert(argument, value) {
                return Err(self.bad(
                    argument,
                    value,
                    "an argument this converter does not implement; refusing rather than ignoring it",
                ));
            }
        }
        Ok(())
    }
}

/// An axis of a tensor of `rank`, negative counting from the end.
pub fn axis(value: i64, rank: usize) -> Option<usize> {
    let resolved = if value < 0 { rank as i64 + value } else { value };
    (0..rank as i64).contains(&resolved).then_some(resolved as usize)
}
