"""`keras2torch MODEL.keras -o OUT`: the command the wheel installs, `convert` from a shell."""

import argparse
import sys

from .flatten import shape_argument


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="keras2torch",
        description="Converts a Keras 3 model (.keras) to an exact PyTorch module: OUT.py (the model as one "
        "readable nn.Module), OUT.safetensors (its state dict) and OUT.probe.safetensors, then checks the "
        "module against the converter's probe (or, with --import, flattens the model's custom layers with "
        "your classes first). Exit status 1 with the reason on a model it cannot convert.",
    )
    parser.add_argument("model", help="the .keras file")
    parser.add_argument("-o", "--out", required=True, help="OUT: writes OUT.py, OUT.safetensors, OUT.probe.safetensors")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="FILE.py",
                        help="a Python file defining custom classes of the model (repeatable; needs Keras)")
    parser.add_argument("--shape", action="append", type=shape_argument, default=[], metavar="NAME=D1,D2",
                        help="sizes (without the batch axis) of an input the model leaves open, for tracing")
    parser.add_argument("--batch-size", type=int, help="a static batch size, for custom layers that need one")
    parser.add_argument("--no-check", action="store_true", help="write the files without checking the module")
    parser.add_argument("--layer", metavar="NAME",
                        help="convert this MultiHeadAttention layer alone (of a .keras, .weights.h5 or .pt file)")
    parser.add_argument("--to", choices=["projected", "torch"], default="projected",
                        help="with --layer: the popular Linear + nn.MultiheadAttention + Linear port, or a bare "
                        "nn.MultiheadAttention (each where exact; refused with the reason where not)")
    parser.add_argument("--num-heads", type=int, help="with --layer on a torch file: its head count")
    args = parser.parse_args(argv)

    from . import ConversionError, convert, convert_layer

    try:
        if args.layer is not None:
            convert_layer(args.model, args.to, layer=args.layer, num_heads=args.num_heads, out=args.out)
        else:
            convert(args.model, out=args.out, imports=args.imports, shapes=dict(args.shape),
                    batch_size=args.batch_size, check=not args.no_check)
    except (ConversionError, FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
