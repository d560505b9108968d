"""Determinism checks that users run in their own test suites."""

from epochal._lazy import lazy_exports

_EXPORTS = {
    "assert_dataset_compatible_with_megatron": "determinism",
    "assert_dataset_elements_not_equal": "determinism",
    "DatasetLocallyNondeterministic": "determinism",
    "DatasetDistributedNondeterministic": "determinism",
    "assert_dataset_deterministic_across_processes": "determinism",
    "assert_samples_equal": "compare",
    "assert_dict_tensors_approx_equal": "compare",
    "detect_global_rng_use": "global_rng",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
