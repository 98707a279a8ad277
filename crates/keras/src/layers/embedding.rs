//! `keras.layers.Embedding`: rows of a table; `mask_zero` masks the id 0. torch: `nn.Embedding`.

use burn::module::{Module, Param};
use burn::tensor::Tensor;

use super::{Build, Call, KerasLayer, Variable};
use crate::saved::VarReader;
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
        if layer.args.take_bool("sparse", false)? {
            return Err(layer.args.error("sparse = true: sparse gradients are not supported"));
        }
        layer.args.take("input_length"); // Keras 2's, ignored by Keras 3 as well
        let mut vars = layer.vars()?;
        let embedding = Self::read(layer, &mut vars)?;
        vars.finish()?;
        Ok(embedding)
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        Ok(vec![self.look_up(call.tensor(0, "inputs")?.tensor)?])
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
        self.torch_look_up(call, &format!("self.{}({ids}.long())", call.attr), &ids)
    }
}

impl Embedding {
    /// `input_dim`, `output_dim` and `mask_zero`, and the table, the first of `vars`: what every
    /// embedding class keeps (`ReversibleEmbedding` reads its reverse table after it).
    pub(super) fn read(layer: &mut Build, vars: &mut VarReader) -> Result<Self> {
        let args = &mut layer.args;
        let input_dim = args.take_usize("input_dim", None)?;
        let output_dim = args.take_usize("output_dim", None)?;
        let mask_zero = args.take_bool("mask_zero", false)?;
        let table =
            vars.next("embeddings", &[Some(input_dim), Some(output_dim)])?.to_tensor("embeddings", layer.device)?;
        Ok(Self { embeddings: Param::from_tensor(table), mask_zero })
    }

    /// The table's rows for `ids` (`[..., output_dim]`), masked where an id is 0 with `mask_zero`.
    pub(super) fn look_up(&self, ids: DynTensor) -> Result<Value> {
        let out = DynTensor::gather_rows(self.embeddings.val(), ids.clone())?; // [..., output_dim]
        let mask = if self.mask_zero {
            let device = ids.device();
            Some(DynTensor::binary(Binary::NotEqual, ids, DynTensor::scalar(0.0, &device))?)
        } else {
            None
        };
        Ok(Value::float(out).with_mask(mask))
    }

    /// Writes the lookup `y` (the module called on the ids `ids`) with its mask, and describes it.
    pub(super) fn torch_look_up(&self, call: &mut TorchCall, y: &str, ids: &str) -> Result<String> {
        let mask = if self.mask_zero { format!("{ids} != 0") } else { "None".into() };
        call.assign(y, &mask);
        let [vocabulary, width] = self.embeddings.dims();
        Ok(format!("nn.Embedding({vocabulary}, {width}){}", if self.mask_zero { ", mask = ids != 0" } else { "" }))
    }
}
