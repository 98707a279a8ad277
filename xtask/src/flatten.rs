//! `cargo xtask flatten MODEL.keras --import LAYERS.py --out FLAT.keras`: custom Keras layers
//! re-traced into built-in layers and operations by the Python front end
//! (`python/keras2torch/flatten.py`), run with the user's Python and Keras.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::{Context, Result};

pub const LONG_ABOUT: &str = "\
Re-traces the custom layers (and subclassed models) of a Keras 3 model into built-in layers and \
operation nodes, and writes a plain functional .keras that `convert` and `predict` read, with the \
model's input and output names and order. It runs the Python front end \
(python/keras2torch/flatten.py) with --python (default python3), which needs Keras 3 and the \
modules defining the custom classes (--import, repeatable). Each custom layer whose call cannot \
be traced (raw TensorFlow ops on symbolic tensors, Python control flow on tensor values, its own \
weights read in call, sizes unknown while tracing: give --shape or --batch-size) is named with the \
reason and kept, so `convert` refuses it by name. The result is checked against the original on \
random inputs (token ids for inputs read by an Embedding) and the largest difference printed; \
exit status 1 if it exceeds 1e-5 or the front end fails.

The same from Python: `from keras2torch import flatten; flat, report = flatten(model)`.";

#[derive(clap::Args)]
pub struct Args {
    /// The .keras file (relative to the working directory).
    model: PathBuf,
    /// A Python file defining custom classes of the model (repeatable).
    #[arg(long = "import", value_name = "FILE.py")]
    imports: Vec<PathBuf>,
    /// The flattened .keras to write.
    #[arg(long)]
    out: PathBuf,
    /// Sizes (without the batch axis) of an input whose sizes the model leaves open: NAME=D1,D2.
    #[arg(long = "shape", value_name = "NAME=D1,D2")]
    shapes: Vec<String>,
    /// A static batch size, for custom layers that build tensors of the batch's size.
    #[arg(long)]
    batch_size: Option<usize>,
    /// The Python interpreter with Keras 3 (and the custom classes' own imports).
    #[arg(long, default_value = "python3")]
    python: PathBuf,
}

/// The repository's Python packages (`python/`), which the front end lives in.
fn python_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../python")
}

pub fn run(args: Args) -> Result<ExitCode> {
    let mut command = Command::new(&args.python);
    let path = match std::env::var_os("PYTHONPATH") {
        Some(existing) => std::env::join_paths(std::iter::once(python_dir()).chain(std::env::split_paths(&existing)))?,
        None => python_dir().into_os_string(),
    };
    command.env("PYTHONPATH", path).args(["-W", "ignore", "-m", "keras2torch.flatten"]).arg(&args.model);
    for import in &args.imports {
        command.arg("--import").arg(import);
    }
    command.arg("--out").arg(&args.out);
    for shape in &args.shapes {
        command.args(["--shape", shape]);
    }
    if let Some(batch) = args.batch_size {
        command.args(["--batch-size", &batch.to_string()]);
    }
    let status = command.status().with_context(|| {
        format!("cannot run {} (give the interpreter with Keras 3 as --python)", args.python.display())
    })?;
    Ok(if status.success() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
