"""The DeepSpeed configuration, generated from the model size and the memory per device.

Pure Python (no torch): the controller's unit tests import it.
"""
from __future__ import annotations

import copy
import json

GIB = 1024 ** 3


def estimate_bytes_per_rank(n_params: int, world_size: int, stage: int, bf16: bool,
                            offload_optimizer: bool = False) -> float:
    """Rough training memory per rank for weights, gradients and Adam states.

    Mixed precision keeps 2-byte weights and gradients plus 12 bytes of fp32
    master weights and Adam moments per parameter; fp32 training 16 bytes.
    ZeRO stage 1 partitions the optimizer states, 2 also the gradients, 3 also
    the weights.  Activations are not included (a 20 % margin is added).
    """
    w, g, o = (2, 2, 12) if bf16 else (4, 4, 8)
    n = float(n_params)
    ws = max(1, world_size)
    opt = 0.0 if offload_optimizer else o * n / (ws if stage >= 1 else 1)
    grads = g * n / (ws if stage >= 2 else 1)
    weights = w * n / (ws if stage >= 3 else 1)
    return 1.2 * (weights + grads + opt)


def generate(n_params: int, world_size: int, accelerator: str = "cpu", device_memory_gib: float | None = None,
             bf16_capable: bool = False, micro_batch: int = 4, grad_accum: int = 1,
             run_dir: str | None = None, steps_per_print: int = 10) -> dict:
    """A DeepSpeed config that fits ``n_params`` on ``world_size`` devices.

    CPU: fp32, ZeRO stage 1 (gloo).  GPU: bf16 where the device has it (fp16
    otherwise); the lowest ZeRO stage that fits the device memory; optimizer
    offload to CPU and activation checkpointing when even stage 3 does not fit.
    """
    cfg: dict = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "gradient_clipping": 1.0,
        "steps_per_print": steps_per_print,
        "wall_clock_breakdown": False,
    }
    if accelerator == "cpu":
        cfg["zero_optimization"] = {"stage": 1}
        cfg["bf16"] = {"enabled": False}
    else:
        bf16 = bool(bf16_capable)
        cfg["bf16"] = {"enabled": bf16}
        if not bf16:
            cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
        budget = (device_memory_gib or 0) * GIB * 0.8
        stage, offload = 3, True
        for candidate in (1, 2, 3):
            if budget and estimate_bytes_per_rank(n_params, world_size, candidate, True) <= budget:
                stage, offload = candidate, False
                break
        zero: dict = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True}
        if stage == 3:
            zero.update({"stage3_gather_16bit_weights_on_model_save": True,
                         "reduce_bucket_size": 5e7, "stage3_prefetch_bucket_size": 5e7,
                         "stage3_param_persistence_threshold": 1e5})
        if offload:
            zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        cfg["zero_optimization"] = zero
        if stage == 3:
            cfg["activation_checkpointing"] = {"partition_activations": True, "contiguous_memory_optimization": False}
    if run_dir:
        cfg["csv_monitor"] = {"enabled": True, "output_path": f"{run_dir}/monitor", "job_name": "train"}
    return cfg


def merge(base: dict, override: dict) -> dict:
    """Deep-merge a user's JSON over the generated config (the user's values win)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_override(path: str) -> dict:
    with open(path, encoding="utf-8") as fh:
        try:
            data = json.load(fh)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, not {type(data).__name__}")
    return data
