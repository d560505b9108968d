"""Accelerate's YAML configuration (what ``accelerate config`` writes), read and written.

A file looks like this (``accelerate config`` with Megatron-LM; every key optional)::

    compute_environment: LOCAL_MACHINE
    distributed_type: MEGATRON_LM
    megatron_lm_config:
      megatron_lm_tp_degree: 2
      megatron_lm_pp_degree: 2
      megatron_lm_num_micro_batches: 2
      megatron_lm_sequence_parallelism: true
      megatron_lm_recompute_activations: true
      megatron_lm_use_distributed_optimizer: true
      megatron_lm_gradient_clipping: 1.0
    mixed_precision: bf16
    num_machines: 1
    num_processes: 8          # over all machines
    machine_rank: 0
    main_process_ip: null
    main_process_port: null
    rdzv_backend: static
    same_network: true
    use_cpu: false

:func:`read_launch_config` checks every key (unknown keys, wrong types and what
epochal cannot run are :class:`YamlConfigError` naming the file and the key) and
returns a :class:`LaunchConfig`; :meth:`LaunchConfig.environment` gives the
variables ``epochal launch`` sets for the script, the same as ``accelerate launch``
(``ACCELERATE_USE_MEGATRON_LM`` for a Megatron-LM configuration, ``MEGATRON_LM_*``, ``ACCELERATE_MIXED_PRECISION``,
``ACCELERATE_USE_CPU``), which :class:`~epochal.accelerate.plugin.MegatronLMPlugin`
and :class:`~epochal.accelerate.Accelerator` read. :func:`to_yaml` writes such a file.

Values are checked where they are read, not later in the script: a key given twice
(YAML would keep the last silently) names its lines; ``megatron_lm_gradient_clipping``
must be a finite number >= 0, the degrees and micro-batches integers >= 1,
``megatron_lm_recompute_granularity`` / ``_method`` one of epochal's (Megatron's) names
(:func:`check_megatron_value`, also applied to ``epochal launch``'s flags).

``distributed_type`` may be ``MEGATRON_LM``, ``NO``, ``MULTI_CPU`` or ``MULTI_GPU``
(data parallelism, still run by epochal's Megatron-style engine); ``DEEPSPEED``,
``FSDP``, ``XLA`` and non-empty ``deepspeed_config`` / ``fsdp_config`` /
``fp8_config`` / ``parallelism_config`` are refused.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "LaunchConfig",
    "YamlConfigError",
    "check_megatron_value",
    "duplicate_keys",
    "read_launch_config",
    "to_yaml",
]

#: ``megatron_lm_config`` key -> (type, ``MEGATRON_LM_*`` suffix)
MEGATRON_KEYS: dict[str, tuple[type, str]] = {
    "megatron_lm_tp_degree": (int, "TP_DEGREE"),
    "megatron_lm_pp_degree": (int, "PP_DEGREE"),
    "megatron_lm_num_micro_batches": (int, "NUM_MICRO_BATCHES"),
    "megatron_lm_sequence_parallelism": (bool, "SEQUENCE_PARALLELISM"),
    "megatron_lm_recompute_activations": (bool, "RECOMPUTE_ACTIVATIONS"),
    "megatron_lm_use_distributed_optimizer": (bool, "USE_DISTRIBUTED_OPTIMIZER"),
    "megatron_lm_gradient_clipping": (float, "GRADIENT_CLIPPING"),
    "megatron_lm_recompute_granularity": (str, "RECOMPUTE_GRANULARITY"),
    "megatron_lm_recompute_method": (str, "RECOMPUTE_METHOD"),
    "megatron_lm_recompute_num_layers": (int, "RECOMPUTE_NUM_LAYERS"),
    "megatron_lm_decoder_last_pipeline_num_layers": (int, "DECODER_LAST_PIPELINE_NUM_LAYERS"),
    "megatron_lm_context_parallel_size": (int, "CONTEXT_PARALLEL_SIZE"),
}
#: keys that must stay empty / off (what they would turn on has no epochal equivalent)
_EMPTY_KEYS = (
    "deepspeed_config",
    "fsdp_config",
    "fp8_config",
    "parallelism_config",
    "mpirun_config",
)
#: keys read and checked for type only (no effect on an epochal run)
_INERT = {
    "compute_environment": str,
    "main_training_function": str,
    "same_network": bool,
    "rdzv_backend": str,
    "downcast_bf16": (str, bool),
    "debug": bool,
    "enable_cpu_affinity": bool,
    "tpu_use_cluster": bool,
    "tpu_use_sudo": bool,
    "tpu_name": (str, type(None)),
    "tpu_zone": (str, type(None)),
    "command_file": (str, type(None)),
    "commands": (list, type(None)),
    "tpu_vm": (list, type(None)),
    "tpu_env": (list, type(None)),
}
_DISTRIBUTED = ("MEGATRON_LM", "NO", "MULTI_CPU", "MULTI_GPU")
_PRECISION = ("no", "fp16", "bf16")


class YamlConfigError(ValueError):
    """An Accelerate configuration epochal cannot launch (names the file and the key)."""


@dataclass
class LaunchConfig:
    """The launch-relevant content of an Accelerate YAML file (or of the command line).

    Attributes:
        num_processes: processes over all machines.
        num_machines / machine_rank: the nodes and this node's rank.
        main_process_ip / main_process_port: node 0's address (multi-node).
        rdzv_backend: ``static`` or ``c10d`` (torchrun's rendezvous).
        mixed_precision: ``no``, ``fp16`` or ``bf16``.
        use_cpu: run on the CPU (gloo).
        gpu_ids: ``all`` or a comma-separated list (``CUDA_VISIBLE_DEVICES``).
        megatron: ``megatron_lm_config`` (keys of :data:`MEGATRON_KEYS`).
        use_megatron_lm: the script's ``Accelerator`` gets a Megatron-LM plugin
            (``ACCELERATE_USE_MEGATRON_LM=true``): ``distributed_type: MEGATRON_LM``, a
            ``megatron_lm_config`` or ``--use_megatron_lm`` / ``--megatron_lm_*`` flags, as
            with ``accelerate launch``; otherwise a plain loop (which clips only through
            ``clip_grad_norm_``).
    """

    num_processes: int = 1
    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: str | None = None
    main_process_port: int | None = None
    rdzv_backend: str = "static"
    mixed_precision: str = "no"
    use_cpu: bool = False
    gpu_ids: str | None = None
    megatron: dict[str, Any] = field(default_factory=dict)
    use_megatron_lm: bool = False

    @property
    def nproc_per_node(self) -> int:
        """Processes on each machine."""
        return self.num_processes // self.num_machines

    def check(self, source: str = "the launch options") -> None:
        """Check the numbers against each other.

        Raises:
            YamlConfigError: naming ``source`` and the key.
        """

        def bad(key: str, why: str) -> YamlConfigError:
            return YamlConfigError(f"{source}: {key} {why}")

        if self.num_processes < 1:
            raise bad("num_processes", f"must be >= 1, got {self.num_processes}")
        if self.num_machines < 1 or self.num_processes % self.num_machines:
            raise bad(
                "num_machines",
                f"must be >= 1 and divide num_processes={self.num_processes}, got {self.num_machines}",
            )
        if not 0 <= self.machine_rank < self.num_machines:
            raise bad(
                "machine_rank",
                f"must be in [0, num_machines={self.num_machines}), got {self.machine_rank}",
            )
        if self.num_machines > 1 and not self.main_process_ip:
            raise bad("main_process_ip", "is needed with several machines (node 0's address)")
        if self.mixed_precision not in _PRECISION:
            raise bad(
                "mixed_precision", f"must be one of {_PRECISION}, got {self.mixed_precision!r}"
            )
        model = (
            self.megatron.get("megatron_lm_tp_degree", 1)
            * self.megatron.get("megatron_lm_context_parallel_size", 1)
            * self.megatron.get("megatron_lm_pp_degree", 1)
        )
        for key, value in self.megatron.items():
            check_megatron_value(key, value, source)
        if self.num_processes % model:
            raise bad(
                "num_processes",
                f"={self.num_processes} is not a multiple of megatron_lm_tp_degree x "
                f"megatron_lm_context_parallel_size x megatron_lm_pp_degree = {model}",
            )

    def environment(self) -> dict[str, str]:
        """The variables ``accelerate launch`` would set (see the module docstring)."""
        env = {
            "ACCELERATE_MIXED_PRECISION": self.mixed_precision,
            "ACCELERATE_USE_CPU": "true" if self.use_cpu else "false",
        }
        if self.use_megatron_lm or self.megatron:
            env["ACCELERATE_USE_MEGATRON_LM"] = "true"
        for key, value in self.megatron.items():
            env["MEGATRON_LM_" + MEGATRON_KEYS[key][1]] = str(value)
        if self.gpu_ids not in (None, "", "all"):
            env["CUDA_VISIBLE_DEVICES"] = str(self.gpu_ids)
        return env


def check_megatron_value(key: str, value: Any, source: str) -> None:
    """Check one ``megatron_lm_config`` value against its allowed range.

    Raises:
        YamlConfigError: naming ``source``, the key, the value and what is allowed.
    """
    from epochal.parallel.config import RECOMPUTE_GRANULARITIES, RECOMPUTE_METHODS

    name = f"megatron_lm_config.{key}"
    if key == "megatron_lm_gradient_clipping":
        if not math.isfinite(value) or value < 0:
            raise YamlConfigError(
                f"{source}: {name}={value!r} must be a finite number >= 0 (0 = no clipping)"
            )
    elif key == "megatron_lm_recompute_granularity" and value not in RECOMPUTE_GRANULARITIES:
        raise YamlConfigError(
            f"{source}: {name}={value!r} must be one of {', '.join(RECOMPUTE_GRANULARITIES)}"
        )
    elif key == "megatron_lm_recompute_method" and value not in RECOMPUTE_METHODS:
        raise YamlConfigError(
            f"{source}: {name}={value!r} must be one of {', '.join(RECOMPUTE_METHODS)}"
        )
    elif MEGATRON_KEYS[key][0] is int:
        low = 0 if key == "megatron_lm_decoder_last_pipeline_num_layers" else 1
        if value < low:
            raise YamlConfigError(f"{source}: {name}={value!r} must be an integer >= {low}")


def duplicate_keys(text: str, source: str) -> None:
    """Refuse a mapping that gives a key twice (YAML itself would keep the last silently).

    Raises:
        YamlConfigError: naming ``source``, the key and the lines it is on.
    """
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return  # the loader words the syntax error
    seen: set[int] = set()
    stack = [(root, "")]
    while stack:
        node, path = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            lines: dict[str, list[int]] = {}
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.value != "<<":
                    lines.setdefault(key_node.value, []).append(key_node.start_mark.line + 1)
                stack.append((value_node, f"{path}{key_node.value}."))
            for key, where in lines.items():
                if len(where) > 1:
                    raise YamlConfigError(
                        f"{source}: key {path}{key} is given {len(where)} times (lines "
                        f"{', '.join(map(str, where))}); keep one"
                    )
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, path) for item in node.value)


def _typed(value: Any, kind: Any, source: str, key: str) -> Any:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if int in kinds and isinstance(value, bool):
        raise YamlConfigError(f"{source}: {key} must be an integer, got {value!r}")
    if not isinstance(value, kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise YamlConfigError(f"{source}: {key} must be {names}, got {value!r}")
    return value


def read_launch_config(path: str | os.PathLike) -> LaunchConfig:
    """Read and check an Accelerate YAML file (see the module docstring).

    Raises:
        FileNotFoundError: no such file.
        YamlConfigError: not a mapping, an unknown key, a wrong type, or something
            epochal cannot run (named).
    """
    import yaml

    from epochal.formats.bounded_parse import ConfigFileError, load_yaml_file, read_config_text

    source = str(path)
    try:
        duplicate_keys(read_config_text(path, "Accelerate configuration"), source)
        doc = load_yaml_file(path, "Accelerate configuration")
    except (ConfigFileError, yaml.YAMLError) as exc:
        raise YamlConfigError(f"{source}: not a readable YAML file ({exc})") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise YamlConfigError(f"{source}: expected a mapping of keys, got {type(doc).__name__}")
    spec = LaunchConfig()
    fields = {
        "num_processes": int,
        "num_machines": int,
        "machine_rank": int,
        "main_process_ip": (str, type(None)),
        "main_process_port": (int, type(None)),
        "gpu_ids": (str, int, type(None)),
    }
    for key, value in doc.items():
        if key in fields:
            value = _typed(value, fields[key], source, key)
            setattr(spec, key, str(value) if key == "gpu_ids" and value is not None else value)
        elif key == "distributed_type":
            if str(value).upper() not in _DISTRIBUTED:
                raise YamlConfigError(
                    f"{source}: distributed_type={value!r} is not supported by epochal "
                    f"(one of {', '.join(_DISTRIBUTED)}; epochal trains Megatron-style)"
                )
            spec.use_megatron_lm = str(value).upper() == "MEGATRON_LM"
        elif key == "mixed_precision":
            spec.mixed_precision = str(_typed(value, str, source, key)).lower()
        elif key == "use_cpu":
            spec.use_cpu = _typed(value, bool, source, key)
        elif key == "rdzv_backend":
            spec.rdzv_backend = _typed(value, str, source, key)
        elif key == "megatron_lm_config":
            spec.megatron = _megatron(value or {}, source)
        elif key in _EMPTY_KEYS:
            if value not in (None, {}, []):
                raise YamlConfigError(
                    f"{source}: {key} is not supported by epochal (leave it empty)"
                )
        elif key == "dynamo_config":
            backend = (
                (value or {}).get("dynamo_backend", "NO") if isinstance(value, dict) else value
            )
            if str(backend).upper() != "NO":
                raise YamlConfigError(
                    f"{source}: dynamo_config: epochal does not compile the script's model"
                )
        elif key in _INERT:
            _typed(value, _INERT[key], source, key)
        else:
            raise YamlConfigError(
                f"{source}: unknown key {key!r} (known: {', '.join(sorted([*fields, *_INERT, *_EMPTY_KEYS, 'distributed_type', 'mixed_precision', 'use_cpu', 'megatron_lm_config', 'dynamo_config']))})"
            )
    spec.check(source)
    return spec


def _megatron(block: Any, source: str) -> dict[str, Any]:
    if not isinstance(block, dict):
        raise YamlConfigError(f"{source}: megatron_lm_config must be a mapping")
    out = {}
    for key, value in block.items():
        if key not in MEGATRON_KEYS:
            raise YamlConfigError(
                f"{source}: megatron_lm_config.{key} is not supported by epochal "
                f"(supported: {', '.join(MEGATRON_KEYS)})"
            )
        out[key] = _typed(value, MEGATRON_KEYS[key][0], source, f"megatron_lm_config.{key}")
        check_megatron_value(key, out[key], source)
    return out


def to_yaml(spec: LaunchConfig) -> str:
    """The YAML text of ``spec`` in ``accelerate config``'s layout (keys sorted, as it writes them)."""
    import yaml

    doc: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": "MEGATRON_LM",
        "downcast_bf16": "no",
        "machine_rank": spec.machine_rank,
        "main_process_ip": spec.main_process_ip,
        "main_process_port": spec.main_process_port,
        "main_training_function": "main",
        "megatron_lm_config": dict(spec.megatron),
        "mixed_precision": spec.mixed_precision,
        "num_machines": spec.num_machines,
        "num_processes": spec.num_processes,
        "rdzv_backend": spec.rdzv_backend,
        "same_network": True,
        "use_cpu": spec.use_cpu,
    }
    return yaml.safe_dump(doc, sort_keys=True)


def write_yaml(spec: LaunchConfig, path: str | os.PathLike) -> Path:
    """Write :func:`to_yaml` to ``path`` atomically, after ``epochal config``'s marker line
    (:data:`epochal._ownership.CONFIG_MARKER`, a YAML comment)."""
    from epochal._atomic import atomic_write
    from epochal._ownership import CONFIG_MARKER

    spec.check(str(path))
    atomic_write(path, f"{CONFIG_MARKER}\n{to_yaml(spec)}")
    return Path(path)
