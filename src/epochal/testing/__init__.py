"""Determinism checks that users run in their own test suites."""

from epochal._lazy import lazy_exports

_EXPORTS = {
    "assert_dataset_compatible_with_megatron": "determinism",
    "assert_dataset_elements_not_equal": "determinism",
    "DatasetLocallyNondeterministic": "determinism",
    "DatasetDistributedNondeterministic": "determinism",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
