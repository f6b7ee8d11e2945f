"""The budget API as a contract: ``/openapi.json`` is a valid OpenAPI 3.1 document generated from
the models the handlers answer with, every answer and error of ``/budget`` validates against it,
the answer names the fallbacks a request over the budget may take, and ``Budget.from_sidecar``
raises one library error with the sidecar's message or reads its cached answer when asked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import validate

from context_ceiling import Budget, BudgetError
from context_ceiling.sidecar.app import create_app
from context_ceiling.sidecar.config import Settings
from context_ceiling.sidecar.openapi import document
from testkit.serving import serve
from testkit.traffic.ceiling_docs import doc, entry


def generated_client(spec: dict[str, Any], where: Path) -> Any:
    """The typed models datamodel-code-generator writes from ``spec``, imported."""
    import importlib.util
    import json
    import sys
    import warnings

    from datamodel_code_generator import InputFileType, generate
    from datamodel_code_generator.enums import DataModelType

    out = where / "budget_client.py"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        generate(
            json.dumps(spec),
            input_file_type=InputFileType.OpenAPI,
            output=out,
            output_model_type=DataModelType.PydanticV2BaseModel,
        )
    loaded = importlib.util.spec_from_file_location("budget_client", out)
    assert loaded is not None and loaded.loader is not None
    module = importlib.util.module_from_spec(loaded)
    sys.modules["budget_client"] = module  # its models' forward references resolve there
    try:
        loaded.loader.exec_module(module)
    finally:
        del sys.modules["budget_client"]
    return module


def conforms(body: Any, schema: str) -> None:
    """``body`` is valid against the document's schema ``schema`` (its references resolved in
    the document)."""
    spec = document()
    OAS31Validator({"$ref": f"#/components/schemas/{schema}", **spec}).validate(body)


def test_the_openapi_document_is_valid_and_covers_the_budget() -> None:
    spec = document()
    validate(spec)  # raises on an invalid document
    budget = spec["paths"]["/budget"]["get"]
    assert {p["name"] for p in budget["parameters"]} == {"model", "workload", "reservation"}
    assert set(budget["responses"]) >= {"200", "400", "401", "404"}
    answer = spec["components"]["schemas"]["BudgetAnswer"]
    assert {"input_budget", "ceiling_tokens", "tokenizer", "fallback", "over_ceiling"} <= set(
        answer["properties"]
    )


@pytest.mark.e2e
def test_the_budget_answers_as_documented_and_the_client_says_why_not(tmp_path: Path) -> None:
    ceilings = tmp_path / "c.yaml"
    ceilings.write_text(
        yaml.safe_dump(
            doc(
                4,
                entry(model="small", workload="rag", tokens=3000, window=8000),
                entry(model="big", workload="rag", tokens=40000, window=128000),
            )
        )
    )
    settings = Settings(
        upstreams={"openai": {"base_url": "http://127.0.0.1:9/v1"}},
        models=[
            {"match": "small", "window": 8000, "max_output_tokens": 500},
            {"match": "big", "window": 128000},
            {"match": "huge", "window": 1000000},
        ],
        workloads=["rag"],
        ceilings_file=ceilings,
        enforcement={
            "workloads": {
                "rag": {"over_ceiling": "fallback", "fallback": ["big", "huge", "nothing"]}
            }
        },
    )
    cache = tmp_path / "budget.json"
    with serve(create_app(settings)) as url:
        served = httpx.get(url + "/openapi.json").json()
        assert served == document()
        answer = httpx.get(
            url + "/budget", params={"model": "small", "workload": "rag", "reservation": 500}
        ).json()
        conforms(answer, "BudgetAnswer")
        assert answer["input_budget"] == 3000 and answer["over_ceiling"] == "fallback"
        assert [(f["model"], f["input_budget"], f["measured"]) for f in answer["fallback"]] == [
            ("big", 40000, True),
            ("huge", 1000000 - 500, False),
        ]
        # a client generated from the served document reads the answer, typed
        client = generated_client(served, tmp_path)
        read = client.BudgetAnswer.model_validate(answer)
        assert read.input_budget == 3000 and read.fallback[0].model == "big"
        with pytest.raises(ValueError, match="input_budget"):
            client.BudgetAnswer.model_validate({**answer, "input_budget": "many"})
        plain = httpx.get(url + "/budget", params={"model": "small"}).json()
        conforms(plain, "BudgetAnswer")
        assert plain["over_ceiling"] == "trim" and plain["fallback"] == []
        for params in ({"model": "nope"}, {"model": "small", "reservation": "x"}, {}):
            r = httpx.get(url + "/budget", params=params)
            assert r.status_code in (400, 404)
            conforms(r.json(), "ErrorBody")
        with pytest.raises(BudgetError) as err:
            Budget.from_sidecar(url, "nope")
        assert err.value.status == 404 and "no model entry matches 'nope'" in str(err.value)
        got = Budget.from_sidecar(url, "small", "rag", 500, cache=cache)
        assert got.tokens == 3000 and cache.is_file()
        with pytest.raises(BudgetError):  # a refusal is never answered from the cache
            Budget.from_sidecar(url, "nope", cache=cache)
    # the sidecar is gone: the cached answer, marked as such, or one error without a cache
    cached = Budget.from_sidecar(url, "small", "rag", 500, cache=cache, timeout=1)
    assert cached.tokens == 3000 and "no budget from" in cached.provenance["cached"]
    with pytest.raises(BudgetError) as gone:
        Budget.from_sidecar(url, "small", timeout=1)
    assert gone.value.status is None and url in str(gone.value)
