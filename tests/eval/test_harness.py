"""The lm-eval bridge: task resolution, and a real offline zero-shot run on a local task YAML with a tiny model."""

from __future__ import annotations

import json

import pytest

from prefzoo.eval.harness import PAPER_TASKS, format_table, resolve_tasks, run_lm_eval


def _write_task(folder, n: int = 12):
    rows = [
        {"question": f"{10 + i}+{20 + i}=", "choices": [str(30 + 2 * i), str(31 + 2 * i)], "label": 0} for i in range(n)
    ]
    data = folder / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    yml = folder / "tiny_add.yaml"
    yml.write_text(
        "task: prefzoo_tiny_add\n"
        "dataset_path: json\n"
        "dataset_kwargs:\n"
        "  data_files:\n"
        f"    test: {data.resolve()}\n"  # ABSOLUTE: lm-eval resolves relative paths against the working directory
        "test_split: test\n"
        "output_type: multiple_choice\n"
        'doc_to_text: "{{question}}"\n'
        'doc_to_choice: "{{choices}}"\n'
        "doc_to_target: label\n"
        'target_delimiter: ""\n'
        "metric_list:\n"
        "  - metric: acc\n"
        "    aggregation: mean\n"
        "    higher_is_better: true\n"
    )
    return yml


def test_resolve_named_set_names_and_yaml(tmp_path) -> None:
    assert resolve_tasks("paper")[0] == list(PAPER_TASKS) and len(PAPER_TASKS) == 10
    assert resolve_tasks(None)[0] == list(PAPER_TASKS)
    yml = _write_task(tmp_path)
    names, include = resolve_tasks(f"piqa,{yml}")
    assert names == ["piqa", "prefzoo_tiny_add"] and include == [str(tmp_path.resolve())]
    with pytest.raises(ValueError, match="does not exist"):
        resolve_tasks(str(tmp_path / "missing.yaml"))
    with pytest.raises(ValueError, match="no lm-eval tasks"):
        resolve_tasks(",")


def test_missing_model_folder(tmp_path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        run_lm_eval(tmp_path / "nope", [str(_write_task(tmp_path))])


def test_offline_run_on_local_task(causal_dirs, tmp_path, monkeypatch) -> None:
    pytest.importorskip("lm_eval")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    yml = _write_task(tmp_path)
    res = run_lm_eval(causal_dirs[0], [str(yml)], batch_size=4)
    m = res["tasks"]["prefzoo_tiny_add"]
    assert 0.0 <= m["acc"] <= 1.0 and m["acc_stderr"] > 0
    assert res["average_acc"] == m["acc"] and res["num_fewshot"] == 0
    # 12 two-way questions: the accuracy is a multiple of 1/12
    assert abs(m["acc"] * 12 - round(m["acc"] * 12)) < 1e-6
    table = format_table(res)
    assert "| prefzoo_tiny_add |" in table and "**average**" in table
    json.dumps(res)  # serialisable


def test_unknown_task_name_is_a_clear_error(causal_dirs, tmp_path) -> None:
    pytest.importorskip("lm_eval")
    with pytest.raises(ValueError, match="does not know task"):
        run_lm_eval(causal_dirs[0], [str(_write_task(tmp_path)), "no_such_task_xyz"])


def test_adapter_folder_loads_base_with_peft(tmp_path) -> None:
    from prefzoo.eval.harness import _model_args

    (tmp_path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/models/base"}))
    assert _model_args(tmp_path, "float32") == {"pretrained": "/models/base", "peft": str(tmp_path), "dtype": "float32"}
    assert _model_args(tmp_path / "x", "bfloat16") == {"pretrained": str(tmp_path / "x"), "dtype": "bfloat16"}
