"""Build SageMaker Python SDK v3's own launcher objects from exported `sagemaker` documents.

One list a line, one PLANNER-RESULT line each, until stdin closes (_serve.py).
stdin: JSON list of {"text": exported JSON}. stdout: JSON list of {"ok": true, "config": {...}} or
{"ok": false, "error": "..."}. `sagemaker.train.distributed.SMP` and `Torchrun` are pydantic models
that refuse unknown or mistyped parameters; `SMP._to_mp_hyperparameters()` is what the SDK sends to
the job. (`import sagemaker.core` first: importing sagemaker.train.distributed alone hits a circular
import in sagemaker-core 2.27.0.)
"""

import json
import warnings

warnings.simplefilter("ignore")
import sagemaker.core  # noqa: E402,F401
from sagemaker.train.distributed import SMP, Torchrun  # noqa: E402


def check(item):
    try:
        doc = json.loads(item["text"])
        dist = dict(doc["distributed"])
        if dist.pop("type") != "Torchrun":
            raise ValueError("distributed.type must be Torchrun")
        smp = SMP(**dist.pop("smp"))
        torchrun = Torchrun(smp=smp, **dist)
        return {
            "ok": True,
            "config": {
                "process_count_per_node": torchrun.process_count_per_node,
                "mp_parameters": json.loads(smp._to_mp_hyperparameters()["mp_parameters"]),
                "driver_script": torchrun.driver_script,
                "compute": doc["compute"],
                "batch": doc["batch"],
            },
        }
    except BaseException as err:
        return {"ok": False, "error": f"{type(err).__name__}: {err}"[:2000]}


if __name__ == "__main__":
    from _serve import serve

    serve(lambda items, first: [check(item) for item in items])
