"""Run ``guide_script.py`` several times in one ``epochal launch`` (one process start for many layouts).

``python layouts_worker.py PLAN.json``: the plan is a list of ``{"env": {...},
"argv": [...]}``. The first run keeps the environment ``epochal launch`` set from
the YAML file; every later run sets its own ``MEGATRON_LM_*`` variables first
(``MegatronLMPlugin`` reads them when the script creates its ``Accelerator``).
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import guide_script  # noqa: E402


def main() -> None:
    with open(sys.argv[1]) as f:
        plan = json.load(f)
    for run in plan:
        for key in [k for k in os.environ if k.startswith("MEGATRON_LM_")]:
            if run["env"]:
                del os.environ[key]
        os.environ.update(run["env"])
        guide_script.main(run["argv"])


if __name__ == "__main__":
    main()
