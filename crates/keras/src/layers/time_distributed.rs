//! `keras.layers.TimeDistributed(layer)`: the wrapped layer applied to every step of
//! `[B, T, ...]` on its own (keras 3.15 calls `layer.call` on each `inputs[:, t]`). A layer's
//! output for one row does not depend on the other rows at inference, so here the steps are
//! folded into the batch (`[B·T, ...]`), the layer called once, and the output unfolded. The
//! wrapped layer gets no mask (Keras passes `mask[:, t]` only to a layer whose `call` takes one,
//! which no layer read here that works per step does); the mask goes on unchanged
//! (`supports_masking`). Its variables are saved under the wrapper's `layer` group. torch: the
//! wrapped layer's own module, called on the folded steps.

use burn::module::Module;

use super::{Build, Call, Input, KerasLayer, Layer, Variable};
use crate::torch::{TorchCall, TorchModule};
use crate::value::Value;
use model::error::Result;

#[derive(Module, Debug)]
pub struct TimeDistributed {
    /// The wrapped layer, alone in a `Vec`: a layer inside a layer needs the indirection, and
    /// burn has a module for `Vec` but none for `Box`.
    pub layer: Vec<Layer>,
}

impl TimeDistributed {
    fn inner(&self) -> &Layer {
        &self.layer[0]
    }
}

impl KerasLayer for TimeDistributed {
    fn build(layer: &mut Build) -> Result<Self> {
        let config = layer.args.take("layer");
        let wrapped = layer.wrapped(&config, "layer")?;
        Ok(Self { layer: vec![wrapped] })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?;
        let shape = x.shape();
        if shape.len() < 3 {
            return Err(call.error(format!("TimeDistributed needs [B, T, ...], got {shape:?}")));
        }
        let folded = [&[shape[0] * shape[1]], &shape[2..]].concat();
        let steps = Value { tensor: x.tensor.reshape(&folded)?, dtype: x.dtype, mask: None }; // [B·T, ...]
        let inner = Call {
            what: call.what,
            args: vec![Input::Tensor(steps)],
            kwargs: Vec::new(),
            training: call.training,
            mask: None,
            previous_mask: None,
            node: None,
        };
        let outputs = self.inner().call(&inner)?;
        let [output] = <[Value; 1]>::try_from(outputs).map_err(|_| call.error("the wrapped layer returns several outputs"))?;
        let out_shape = output.shape();
        let unfolded = [&shape[..2], &out_shape[1..]].concat();
        let tensor = output.tensor.reshape(&unfolded)?; // [B, T, ...]
        Ok(vec![Value { tensor, dtype: output.dtype, mask: call.previous_mask.clone() }])
    }

    fn variables(&self) -> Vec<Variable> {
        self.inner()
            .variables()
            .into_iter()
            .map(|v| Variable { path: v.path, group: format!("/layer{}", v.group), tensor: v.tensor })
            .collect()
    }

    fn torch_module(&self, module: &mut TorchModule) -> Result<()> {
        self.inner().torch_module(module)?;
        module.untraced(); // the module sees the folded steps, `[B·T, ...]`
        Ok(())
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        let i = call.index;
        call.line(format!("x{i} = {x}.reshape(-1, *{x}.shape[2:])  # every step at once: [B·T, ...]"));
        let construct = call.wrapped(|inner| self.inner().torch_call(inner))?;
        let mask = call.previous_mask();
        call.assign(&format!("x{i}.reshape({x}.shape[0], {x}.shape[1], *x{i}.shape[1:])"), &mask);
        Ok(format!("TimeDistributed({construct})"))
    }
}
