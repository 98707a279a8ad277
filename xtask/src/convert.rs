//! `cargo xtask convert`: one attention layer of a Keras model file, converted exactly.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use keras::layer_convert::{Target, convert, list_layers};

/// The long help of `cargo xtask convert --help`.
const ABOUT: &str = "\
Convert one attention layer of a model file, read in pure Rust: a Keras 3 MultiHeadAttention
(.keras archive or .weights.h5) or a PyTorch nn.MultiheadAttention (.pt / .pth state dict or
checkpoint, read without executing pickled code; --num-heads gives the chosen layer's head count,
which a state dict does not store), to: keras (a .keras archive that keras.saving.load_model
opens, its .weights.h5 for Model.load_weights, and safetensors in Keras' names), projected (torch
state dict of Linear + nn.MultiheadAttention + Linear, always exact), torch (a bare
nn.MultiheadAttention, where Keras' sizes allow one) or burn (burnpack). A conversion that cannot
be exact is refused with the reason. Each written file holds a probe batch and the source layer's
output on it: check it with `cargo xtask verify FILE` and `python3 xtask/python/check_export.py
FILE`. Prints the layer, its arguments, the parameter counts before and after and the largest
difference between the source and the converted layer on the probe (the written file read back and
run in Burn). Without --to, lists the file's attention layers, each that cannot be converted with
the reason; one such layer does not stop the others from converting.

A whole .keras model with --to torch and no --layer: writes OUT.py (the model as one readable
torch nn.Module whose forward mirrors the graph, Keras' masks carried explicitly; load() returns
it with OUT.safetensors loaded strictly), OUT.safetensors and OUT.probe.safetensors (the probe's
inputs and Burn's output of every node: `python3 OUT.py` names the first node where torch and
Burn differ). The printout lists every node with its parameter count and its torch construct.
With --to burn and no --layer: OUT.bpk, a burnpack of the whole model (its variables and its
config) that `cargo xtask predict` and `keras::KerasModel::from_file` load.";

/// The help text, with the layer classes a whole model may hold (from `keras`' registry).
pub fn long_about() -> String {
    format!("{ABOUT}\n\nLayer classes of a whole model: {}.", keras::layers::supported_classes())
}

#[derive(clap::Args)]
pub struct Args {
    /// A .keras archive, a .weights.h5 file or a .pt / .pth checkpoint (relative to the working directory).
    input: PathBuf,
    /// keras | projected | torch | burn (omit to list the layers).
    #[arg(long)]
    to: Option<Target>,
    /// The layer's name, HDF5 path or state-dict prefix (e.g. `attn.`), when the file holds several.
    #[arg(long, visible_alias = "prefix")]
    layer: Option<String>,
    /// Heads of the chosen PyTorch nn.MultiheadAttention (not stored in its state dict).
    #[arg(long)]
    num_heads: Option<usize>,
    /// Output file (default: beside the input, <stem>.<layer>.<target>.safetensors or .bpk); a name
    /// without an extension gets the target's (.safetensors, .bpk); for keras, the stem of its three files.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// A `.keras` archive (a zip file), as opposed to a `.weights.h5` or a torch file.
fn is_keras_archive(path: &std::path::Path) -> bool {
    std::fs::File::open(path)
        .and_then(|mut f| {
            let mut magic = [0u8; 2];
            std::io::Read::read_exact(&mut f, &mut magic).map(|_| magic == *b"PK")
        })
        .unwrap_or(false)
}

pub fn run(args: Args) -> Result<ExitCode> {
    let Some(target) = args.to else {
        print!("attention layers of {}:\n{}", args.input.display(), list_layers(&args.input, args.num_heads)?);
        return Ok(ExitCode::SUCCESS);
    };
    let whole_model =
        args.layer.is_none() && matches!(target, Target::Torch | Target::Burn) && is_keras_archive(&args.input);
    let report = if whole_model && target == Target::Torch {
        keras::convert::convert_model_to_torch(&args.input, args.out)?
    } else if whole_model {
        keras::convert::convert_model_to_burn(&args.input, args.out)?
    } else {
        convert(&args.input, target, args.layer.as_deref(), args.num_heads, args.out)?.to_string()
    };
    print!("{report}");
    Ok(ExitCode::SUCCESS)
}
