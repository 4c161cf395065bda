"""A model factory whose process dies at batch 3, as a worker killed mid-sweep (OOM killer, kill -9) does.

Each call at batch 3 first appends a line to the file named by CASTCORE_TEST_DEATHS, so a test can count them."""

import os

import torch


def make(batch: int = 1, dtype: torch.dtype = torch.float32):
    if batch == 3:
        with open(os.environ["CASTCORE_TEST_DEATHS"], "a") as deaths:
            deaths.write(f"{os.getpid()}\n")
        os._exit(17)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).to(dtype)
    return model, (torch.empty(batch, 32, dtype=dtype, device="meta"),)
