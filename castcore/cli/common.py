"""What several commands share: the plugin and model options, the Session they make, --strict."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from castcore.devices.dtypes import MODEL_DTYPES
from castcore.errors import CastcoreError
from castcore.workload.spec import (ACTIVATION_DTYPES, DEPLOYMENT, KV_CACHE_DTYPES, KV_READS, PHASES, WEIGHT_DTYPES,
                                    build_workload, preset_names)

if TYPE_CHECKING:
    from castcore.workload.session import Session
    from castcore.workload.spec import Workload


class StrictFailure(CastcoreError):
    """--strict turned a reported problem into a failure (exit 1)."""


def add_plugin_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("plugins and devices")
    group.add_argument("--custom-op-dir", action="append", metavar="DIR",
                       help="load every *.py in DIR as a plugin that beats installed packs (repeatable; "
                            "also CASTCORE_CUSTOM_OP_PATH)")
    group.add_argument("--no-default-custom-op-dirs", action="store_true",
                       help="do not load custom_op/ in the project root and $XDG_CONFIG_HOME/castcore/custom_op "
                            "(also default_custom_op_dirs = false in castcore.toml)")
    group.add_argument("--device-file", action="append", metavar="TOML",
                       help="add a device profile from a TOML file (repeatable); the first is the default device")
    group.add_argument("--no-packs", action="store_true", help="load no installed packs (same as CASTCORE_LOAD_PACKS=)")
    group.add_argument("--strict", action="store_true", default=None,
                       help="fail on any plugin that did not load, and as each command says (also CASTCORE_STRICT=1)")
    group.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")


def add_cache_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-cache", action="store_true",
                        help="capture anew and keep nothing: by default a capture is stored in castcore's cache "
                             "(castcore cache info) and a later run with the same model, options and castcore, torch, "
                             "transformers and pack versions loads it instead of building the model")


def use_capture_cache(session: Session, args: argparse.Namespace):
    """The capture cache as the session's capture step, unless --no-cache; None then."""
    if args.no_cache:
        return None
    from castcore.sweeps.capture import CaptureCache

    session.capture_step = CaptureCache()
    return session.capture_step


def report_capture_cache(cache) -> None:
    """What the capture cache did that a user should know: entries it discarded or could not keep, a load."""
    if cache is None:
        return
    for line in cache.warnings:
        warn(line)
    if cache.stats.loaded and not cache.stats.captured:
        note("loaded the capture from castcore's cache (--no-cache captures anew)")


def add_model_argument(group, default_model: str | None) -> None:
    group.add_argument("--model", default=default_model,
                       help=f"a preset ({', '.join(preset_names())}), a transformers config.json path, or "
                            "package.module:factory" + (f" (default: {default_model})" if default_model else ""))


def add_dtype_argument(group) -> None:
    group.add_argument("--dtype", default="bf16", choices=MODEL_DTYPES,
                       help="weights and activations (default: bf16); tf32 is float32 with TF32 matrix products")


def add_model_options(parser: argparse.ArgumentParser, default_model: str | None) -> None:
    group = parser.add_argument_group("model")
    add_model_argument(group, default_model)
    group.add_argument("--batch", type=int, default=1, help="sequences per batch (default: 1)")
    group.add_argument("--seq", type=int, default=2048, help="tokens per sequence (default: 2048)")
    add_dtype_argument(group)
    group.add_argument("--phase", default="prefill", choices=PHASES,
                       help="prefill: --seq tokens at once; decode: one new token per sequence over a KV cache "
                            "(default: prefill)")
    group.add_argument("--kv-len", type=int, help="tokens already in the KV cache for --phase decode (default: --seq)")
    group.add_argument("--train", action="store_true", help="a training step: forward and backward of the loss")
    group.add_argument("--all-logits", action="store_true",
                       help="a prefill computes the LM head for every token (scoring), not only the last one a "
                            "server samples from (the default)")
    group.add_argument("--no-reuse", action="store_true",
                       help="run every one of a model's identical layers on fake tensors instead of capturing one "
                            "and replaying it for the rest (same totals, slower)")
    add_deployment_options(parser)


def add_deployment_options(parser: argparse.ArgumentParser) -> None:
    """How the model is deployed: kernels, quantization, parallelism. ``estimate`` and ``serve`` share them."""
    kernels = parser.add_argument_group("kernels and quantization")
    kernels.add_argument("--eager", action="store_true",
                         help="price the Hugging Face graph as it runs eagerly, instead of the fused kernels a "
                              "serving engine runs (fused attention, RMSNorm, add+RMSNorm, rotary, SwiGLU, MoE)")
    kernels.add_argument("--weights", choices=WEIGHT_DTYPES, metavar="DTYPE",
                         help=f"quantized weights ({', '.join(WEIGHT_DTYPES)}); alone, weight-only quantization "
                              "(dequantized in the matmul, activations stay in --dtype)")
    kernels.add_argument("--activations", choices=ACTIVATION_DTYPES, metavar="DTYPE",
                         help="with --weights of the same dtype: W8A8 / FP8 matmuls (activations quantized per token)")
    kernels.add_argument("--kv-cache", choices=KV_CACHE_DTYPES, metavar="DTYPE",
                         help=f"KV cache dtype ({', '.join(KV_CACHE_DTYPES)}; default: --dtype)")
    kernels.add_argument("--kv-reads", choices=KV_READS, default="group",
                         help="how the fused attention kernel reads grouped K/V heads (GQA): 'group' once per K/V "
                              "head for its query heads (FlashAttention, FlashInfer, TensorRT-LLM's XQA; the "
                              "default), 'head' once per query head, as TensorRT-LLM's masked MHA kernel did "
                              "before 0.7"),
    split = parser.add_argument_group("parallelism (figures are per device)")
    split.add_argument("--tp", type=int, default=1, metavar="N",
                       help="tensor parallel over N devices (torch's parallelize_module on a fake process group): "
                            "estimate one device's compute, memory and collectives (default: 1)")
    split.add_argument("--sp", action="store_true",
                       help="sequence parallelism with --tp: norms and elementwise ops on 1/N of the tokens, "
                            "reduce-scatter and all-gather instead of all-reduce")
    split.add_argument("--ep", type=int, default=1, metavar="N",
                       help="expert parallel over N devices (MoE models): experts split across them, tokens "
                            "dispatched and combined by all-to-all (default: 1)")
    split.add_argument("--pp", type=int, default=1, metavar="N",
                       help="pipeline parallel over N stages: layers split into stages, activations sent between "
                            "them (default: 1)")
    split.add_argument("--micro-batches", type=int, default=1, metavar="M",
                       help="with --pp: the batch goes through the stages in M micro-batches (default: 1)")
    split.add_argument("--dp", type=int, default=1, metavar="N",
                       help="data-parallel replicas of the whole deployment, for throughput (default: 1)")


def deployment_from(args: argparse.Namespace) -> dict:
    """The deployment options as build_workload's keyword arguments."""
    return {name: (not args.eager if name == "fuse" else getattr(args, name)) for name in DEPLOYMENT}


def workload_from(args: argparse.Namespace) -> Workload:
    """The Workload the model options describe: exactly what build_workload makes from the same values."""
    return build_workload(args.model, batch=args.batch, seq=args.seq, phase=args.phase, kv_len=args.kv_len,
                          train=args.train, all_logits=args.all_logits, reuse=not args.no_reuse,
                          **deployment_from(args))


def make_session(args: argparse.Namespace, **extra) -> Session:
    """A Session from the plugin options; plugin problems are printed, and fail under --strict."""
    from castcore.workload.session import Session

    session = Session(custom_op_dirs=args.custom_op_dir, device_files=args.device_file,
                      load_packs=[] if args.no_packs else None, strict=args.strict,
                      default_custom_op_dirs=False if args.no_default_custom_op_dirs else None, **extra)
    for line in session.warnings + session.notes:
        warn(line)
    if session.config.strict and session.warnings:  # a note (a slow import) is no fault
        raise StrictFailure(f"{len(session.warnings)} plugin problem(s) above and --strict is on")
    return session


def progress_printer():
    """A capture progress callback when stderr is a terminal, else None."""
    if not sys.stderr.isatty():
        return None

    def show(count: int) -> None:
        print(f"\rcastcore: {count} op calls captured", end="", file=sys.stderr, flush=True)
    return show


def note(message: str) -> None:
    print(f"castcore: {message}", file=sys.stderr)


def warn(message: str) -> None:
    print(f"castcore: warning: {message}", file=sys.stderr)


def fail_on_fallback(session: Session, fallback_ops: list[str]) -> None:
    """Under --strict, ops left to the memory-only estimate are a failure naming them."""
    if session.config.strict and fallback_ops:
        raise StrictFailure(f"{len(fallback_ops)} op(s) fell back to the memory-only estimate and --strict is on: "
                            f"{', '.join(fallback_ops)}; give them an estimator or op_properties")
