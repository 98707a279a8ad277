//! `keras.layers.Embedding`: rows of a table; `mask_zero` masks the id 0. torch: `nn.Embedding`.

use burn::module::{Module, Param};
use burn::tensor::Tensor;

use super::{Build, Call, KerasLayer, Variable};
use crate::torch::{TorchCall, TorchModule};
use crate::value::{Binary, DynTensor, Value};
use model::error::Result;
use model::weights::HostTensor;

#[derive(Module, Debug)]
pub struct Embedding {
    /// `[input_dim, output_dim]`
    pub embeddings: Param<Tensor<2>>,
    pub mask_zero: bool,
}

impl KerasLayer for Embedding {
    fn build(layer: &mut Build) -> Result<Self> {
        let args = &mut layer.args;
        let input_dim = args.take_usize("input_dim", None)?;
        let output_dim = args.take_usize("output_dim", None)?;
        let mask_zero = args.take_bool("mask_zero", false)?;
        if args.take_bool("sparse", false)? {
            return Err(args.error("sparse = true: sparse gradients are not supported"));
        }
        args.take("input_length"); // Keras 2's, ignored by Keras 3 as well
        let mut vars = layer.vars()?;
        let table =
            vars.next("embeddings", &[Some(input_dim), Some(output_dim)])?.to_tensor("embeddings", layer.device)?;
        vars.finish()?;
        Ok(Self { embeddings: Param::from_tensor(table), mask_zero })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let ids = call.tensor(0, "inputs")?;
        let out = DynTensor::gather_rows(self.embeddings.val(), ids.tensor.clone())?;
        let mask = if self.mask_zero {
            let device = ids.tensor.device();
            Some(DynTensor::binary(Binary::NotEqual, ids.tensor, DynTensor::scalar(0.0, &device))?)
        } else {
            None
        };
        Ok(vec![Value::float(out).with_mask(mask)])
    }

    fn variables(&self) -> Vec<Variable> {
        vec![Variable::new("embeddings", HostTensor::from_tensor(self.embeddings.val()))]
    }

    fn torch_module(&self, module: &mut TorchModule) -> Result<()> {
        let [vocabulary, width] = self.embeddings.dims();
        module.construct(format!("torch.nn.Embedding({vocabulary}, {width})"));
        module.tensor("weight", HostTensor::from_tensor(self.embeddings.val()));
        Ok(())
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let ids = call.input()?;
        let mask = if self.mask_zero { format!("{ids} != 0") } else { "None".into() };
        call.assign(&format!("self.{}({ids}.long())", call.attr), &mask);
        let [vocabulary, width] = self.embeddings.dims();
        Ok(format!("nn.Embedding({vocabulary}, {width}){}", if self.mask_zero { ", mask = ids != 0" } else { "" }))
    }
}
