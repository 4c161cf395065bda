"""The op and inputs a command line names: ``module:function`` or ``file.py:function``, ``--input 4096x1024:bf16``
and ``--arg name=value`` (castcore partition and castcore measure).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

import torch

from castcore.devices.dtypes import TENSOR_DTYPES, torch_dtype
from castcore.operator_tools.partition import PartitionError
from castcore.ops.annotations import CustomOpError
from castcore.ops.record import RegisteredOp
from castcore.ops.register import lookup


def load_target(spec: str) -> RegisteredOp:
    """A registered op from ``module:function`` or ``path/to/file.py:function``."""
    target = load_callable(spec)
    try:
        return lookup(target)
    except KeyError:
        raise PartitionError(
            f'{spec!r} is not registered: decorate it with @castcore.register_op("...")'
        ) from None


def load_callable(spec: str) -> Any:
    """Whatever ``module:function`` or ``path/to/file.py:function`` names, importing it first."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise PartitionError(f"{spec!r}: name the op as module:function or file.py:function")
    try:
        if module_name.endswith(".py") or "/" in module_name:
            path = Path(module_name)
            if not path.is_file():
                raise PartitionError(f"{spec!r}: no such file {path}")
            name = f"castcore_ops_{path.stem}"
            loader_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[name] = module
            loader_spec.loader.exec_module(module)
        else:
            if "" not in sys.path:
                sys.path.insert(0, "")
            module = importlib.import_module(module_name)
    except PartitionError:
        raise
    except CustomOpError:
        raise
    except Exception as exc:
        raise PartitionError(
            f"{spec!r}: importing {module_name} failed: {type(exc).__name__}: {exc}"
        ) from None
    target = getattr(module, attr, None)
    if target is None:
        raise PartitionError(f"{spec!r}: {module_name} has no {attr!r}")
    return target


def parse_input(text: str, dtype: torch.dtype, literal_first: bool = False) -> Any:
    """``4096x1024`` or ``4096x1024:bf16`` -> a meta tensor; ``scalar:fp32`` -> a 0-dim one;
    ``none``, numbers, strings and lists as Python literals. ``literal_first`` (for --arg):
    ``8`` is the number 8, not a tensor of 8 elements."""
    if literal_first and ":" not in text and "x" not in text:
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError):
            pass
    shape_text, _, dtype_text = text.partition(":")
    if dtype_text:
        if dtype_text not in TENSOR_DTYPES:
            raise PartitionError(
                f"--input {text!r}: unknown dtype {dtype_text!r}; use {', '.join(TENSOR_DTYPES)}"
            )
        dtype = torch_dtype(dtype_text)
    if shape_text == "scalar":
        return torch.empty((), dtype=dtype, device="meta")
    parts = shape_text.split("x")
    if all(p.isdigit() for p in parts):
        return torch.empty([int(p) for p in parts], dtype=dtype, device="meta")
    if dtype_text:
        raise PartitionError(f"--input {text!r}: a tensor is written like 4096x1024:bf16")
    if text.lower() == "none":
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def example_inputs(
    record: RegisteredOp | None, inputs: list[str], arguments: list[str], dtype: str, name: str = ""
) -> tuple[list, dict]:
    """The call's arguments from --input (positional, in order) and --arg (by name)."""
    tensor_dtype = torch_dtype(dtype)
    kwargs = {}
    for item in arguments:
        key, sep, value = item.partition("=")
        if not sep:
            raise PartitionError(f"--arg {item!r}: write name=value")
        kwargs[key] = parse_input(value, tensor_dtype, literal_first=True)
    if inputs:
        return [parse_input(i, tensor_dtype) for i in inputs], kwargs
    if record is None:
        raise PartitionError(f"{name}: give its inputs, e.g. --input 4096x1024 --input 1024x4096:bf16")
    raise PartitionError(
        f"{record.qualname}: give its inputs, e.g. --input 4096x1024 --input 1024x4096:bf16 "
        f"(annotation: {record.annotation if isinstance(record.annotation, str) else 'a function'})"
    )
