"""Every touch of another library's private code lives in `align/compat/`, one module per library, each
checked at import against the versions it was written for. Here: a scan of align/ that finds a private name
of another library outside compat/, each compat module's version check, and one contract test per compat
entry, which fails when the library changes underneath it."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

PACKAGE = Path(__file__).resolve().parents[1] / "align"
COMPAT = PACKAGE / "compat"

LIBRARIES = ("torch", "transformers", "trl", "peft", "datasets", "accelerate", "deepspeed", "ray")
"""The libraries whose private names only align/compat/ may use."""
STDLIB_PRIVATE = {"os._exit", "sys._getframe"}
"""Private by name, public by documentation: the standard library's own."""
ACCESSORS = {"getattr", "setattr", "hasattr", "delattr"}


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def leading_text(node: ast.expr) -> str | None:
    """The text a string constant or an f-string starts with."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return str(node.values[0].value)
    return None


def library_names(tree: ast.Module) -> set[str]:
    """The names a module binds to something of the libraries (`import torch`, `from trl import X`)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in LIBRARIES:
                    names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in LIBRARIES:
            names |= {alias.asname or alias.name for alias in node.names}
    return names


def root_name(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def subclass_touches(cls: ast.ClassDef, where: str) -> list[str]:
    """In a class built on a library's class: the private methods it overrides and the private attributes
    of its base it reads on `self` (those it sets itself are its own)."""
    own = {
        target.attr
        for node in ast.walk(cls)
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Attribute) and root_name(target) == "self"
    }
    found = [
        f"{where}:{node.lineno} overrides {cls.name}.{node.name}"
        for node in cls.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and private(node.name)
    ]
    methods = {node.name for node in cls.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    found += [
        f"{where}:{node.lineno} reads self.{node.attr} of {cls.name}'s base"
        for node in ast.walk(cls)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and private(node.attr)
        and node.attr not in own | methods
    ]
    return found


def private_touches(path: Path, root: Path = PACKAGE.parent) -> list[str]:
    """Each place in `path` that names a private attribute or module of another library, as file:line."""
    tree = ast.parse(path.read_text())
    where = str(path.relative_to(root))
    found = []
    libraries = library_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if ast.unparse(node) not in STDLIB_PRIVATE:
                found.append(f"{where}:{node.lineno} names {ast.unparse(node)}")
        elif isinstance(node, ast.Import):
            found += [
                f"{where}:{node.lineno} imports {alias.name}"
                for alias in node.names
                if any(private(part) for part in alias.name.split("."))
            ]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.module.startswith("align"):
            names = [node.module, *(alias.name for alias in node.names)]
            if any(private(part) for name in names for part in name.split(".")):
                found.append(f"{where}:{node.lineno} imports from {node.module}")
        elif isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id in ACCESSORS and len(node.args) > 1:
                text = leading_text(node.args[1])
                if text is not None and private(text):
                    found.append(f"{where}:{node.lineno} {node.func.id}s {text!r}")
            found += [
                f"{where}:{node.lineno} passes {keyword.arg}="
                for keyword in node.keywords
                if keyword.arg and private(keyword.arg)
            ]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            module = node.value.split(".")
            if module[0] in LIBRARIES and len(module) > 1 and any(private(part) for part in module):
                found.append(f"{where}:{node.lineno} names the module {node.value}")
        elif isinstance(node, ast.ClassDef) and any(root_name(base) in libraries for base in node.bases):
            found += subclass_touches(node, where)
    return found


def test_nothing_outside_compat_names_a_private_attribute_of_another_library() -> None:
    found = [
        touch
        for path in sorted(PACKAGE.rglob("*.py"))
        if COMPAT not in path.parents
        for touch in private_touches(path)
    ]
    assert found == [], "move these into align/compat/ (one module per library):\n" + "\n".join(found)


def test_the_scan_finds_each_kind_of_private_touch(tmp_path: Path) -> None:
    example = tmp_path / "example.py"
    example.write_text(
        "import os\nimport ray._private.utils\nfrom datasets.table import _opener\n"
        "from trl import GRPOTrainer\n"
        "os._exit(1)\n"
        "x = param._local_tensor\n"
        "getattr(trainer, '_logs')\n"
        "setattr(t, f'_{name}', 1)\n"
        "logger = 'ray._private.runtime_env'\n"
        "view = dict(_tokenizer=1)\n"
        "class Timed(GRPOTrainer):\n"
        "    def _generate(self):\n"
        "        self.own = self._logs\n"
        "        return super()._generate()\n"
    )
    touches = {touch.split(" ", 1)[1] for touch in private_touches(example, tmp_path)}
    assert touches == {
        "imports ray._private.utils",
        "imports from datasets.table",
        "names param._local_tensor",
        "getattrs '_logs'",
        "setattrs '_'",
        "names the module ray._private.runtime_env",
        "passes _tokenizer=",
        "overrides Timed._generate",
        "reads self._logs of Timed's base",
        "names super()._generate",
    }


# --- the version each compat module was written for ---

COMPAT_MODULES = {
    "torch": "torch",
    "transformers": "transformers",
    "trl": "trl",
    "peft": "peft",
    "datasets": "datasets",
    "accelerate": "accelerate",
    "ray": "ray",
}
"""compat module -> the distribution it checks."""


def pinned() -> dict[str, str]:
    """The exact versions pyproject.toml pins, by distribution."""
    text = (PACKAGE.parent / "pyproject.toml").read_text()
    return dict(re.findall(r'"([a-z_]+)(?:\[[^\]]*\])?==([0-9.]+)"', text))


def test_every_compat_module_is_written_for_the_pinned_version() -> None:
    pins = pinned()
    found = {path.stem for path in COMPAT.glob("*.py")} - {"__init__", "versions"}
    assert found == set(COMPAT_MODULES), "name the new compat module's library in COMPAT_MODULES"
    for module, library in COMPAT_MODULES.items():
        written_for = importlib.import_module(f"align.compat.{module}").WRITTEN_FOR
        assert Version(pins[library]) in SpecifierSet(written_for), (module, pins[library], written_for)


def test_a_version_outside_the_range_is_refused_by_name(monkeypatch) -> None:
    from align.compat import versions

    assert versions.refusal("datasets", "5.2.1", ">=5.2,<5.3") is None
    problem = versions.refusal("datasets", "5.3.0", ">=5.2,<5.3")
    assert problem is not None and "datasets 5.3.0" in problem and "datasets>=5.2,<5.3" in problem
    assert "tests/test_compat.py" in problem and "WRITTEN_FOR" in problem
    import align.compat.datasets as compat_datasets

    monkeypatch.setattr(versions, "version", lambda library: "5.3.0")
    with pytest.raises(versions.UnsupportedVersion, match=r"datasets 5\.3\.0 is installed"):
        importlib.reload(compat_datasets)
    monkeypatch.undo()
    importlib.reload(compat_datasets)


def test_an_uninstalled_library_is_not_checked(monkeypatch) -> None:
    from align.compat import versions

    def missing(library: str) -> str:
        raise versions.PackageNotFoundError(library)

    monkeypatch.setattr(versions, "version", missing)
    versions.check_version("ray", ">=2.60,<2.61")


def test_the_compat_modules_import_no_heavy_library() -> None:
    """validate and plan import compat modules (data/, run/): none imports its library at module level,
    except transformers.py, which only trainers/ imports."""
    code = (
        "import sys\n"
        "import align.compat.torch, align.compat.trl, align.compat.peft, align.compat.datasets\n"
        "import align.compat.accelerate, align.compat.ray\n"
        "print(sorted(m for m in ('torch', 'transformers', 'trl', 'peft', 'datasets', 'accelerate', 'ray')"
        " if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


# --- contract tests: each entry's private code is there, as the entry uses it ---


def test_torch_a_dtensors_local_shard_is_the_attribute_to_local_reads() -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from align.compat.torch import local_shard, replace_local_shard

    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        param = torch.nn.Parameter(distribute_tensor(torch.arange(6.0), mesh, [Shard(0)]))
        assert local_shard(param).data_ptr() == param.to_local().data_ptr()
        copy = local_shard(param).clone()
        replace_local_shard(param, copy)
        assert local_shard(param) is copy and param.to_local().data_ptr() == copy.data_ptr()
        torch.testing.assert_close(param.full_tensor(), torch.arange(6.0))
    finally:
        if started:
            dist.destroy_process_group()


def test_accelerate_resetting_its_state_forgets_every_singleton() -> None:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState, PartialState

    from align.compat.accelerate import reset_accelerate_state

    Accelerator(cpu=True)
    assert AcceleratorState._shared_state and GradientState._shared_state and PartialState._shared_state
    reset_accelerate_state()
    assert AcceleratorState._shared_state == GradientState._shared_state == PartialState._shared_state == {}


def test_datasets_a_fingerprint_is_what_a_transform_names_its_result(tmp_path) -> None:
    from datasets import Dataset

    from align.compat.datasets import dataset_fingerprint

    rows = Dataset.from_dict({"a": [1, 2]})
    assert isinstance(dataset_fingerprint(rows), str) and dataset_fingerprint(rows)
    mapped = rows.map(lambda row: row, new_fingerprint="f" * 32)
    assert dataset_fingerprint(mapped) == "f" * 32


def test_datasets_opens_every_arrow_file_through_the_replaceable_opener(tmp_path) -> None:
    from datasets import Dataset

    from align.compat.datasets import arrow_file_opener, replace_arrow_file_opener

    Dataset.from_dict({"a": [1, 2]}).save_to_disk(tmp_path / "rows")
    original = arrow_file_opener()
    assert original is not None and list(inspect.signature(original).parameters) == ["filename"]
    opened: list[str] = []

    def recording(filename: str):
        opened.append(filename)
        return original(filename)

    replace_arrow_file_opener(recording)
    try:
        assert Dataset.load_from_disk(str(tmp_path / "rows"))["a"] == [1, 2]
    finally:
        replace_arrow_file_opener(original)
    assert arrow_file_opener() is original
    assert opened and all(name.endswith(".arrow") for name in opened)


def test_ray_per_node_resources_take_no_arguments() -> None:
    import ray._private.state as state

    for name in ("available_resources_per_node", "total_resources_per_node"):
        assert inspect.signature(getattr(state, name)).parameters == {}, name


def test_ray_init_takes_the_embedded_heads_private_keywords() -> None:
    import ray

    from align.compat.ray import embedded_head_settings

    source = inspect.getsource(ray.init)  # private keywords are taken from its **kwargs
    for keyword in embedded_head_settings("127.0.0.1", {}):
        assert f'kwargs.pop("{keyword}"' in source, keyword


def test_ray_installs_its_sigterm_handler_through_the_replaceable_function() -> None:
    import ray._private.utils as ray_utils
    import ray._private.worker as ray_worker

    from align.compat.ray import no_sigterm_handler

    installs = ray_utils.set_sigterm_handler
    assert list(inspect.signature(installs).parameters) == ["sigterm_handler"]
    assert "ray._private.utils.set_sigterm_handler(" in inspect.getsource(ray_worker)  # looked up per call
    with no_sigterm_handler():
        assert ray_utils.set_sigterm_handler is not installs
        assert ray_utils.set_sigterm_handler(lambda *_: None) is None
    assert ray_utils.set_sigterm_handler is installs


def test_ray_prints_the_drivers_lines_through_the_replaceable_printer() -> None:
    import ray._private.worker as ray_worker

    from align.compat.ray import print_driver_lines_with

    printer = ray_worker.print_to_stdstream
    assert list(inspect.signature(printer).parameters) == ["data", "ignore_prefix"]
    written = []
    print_driver_lines_with(lambda data, ignore_prefix: written.append(data))
    try:
        ray_worker.print_to_stdstream({"lines": ["x"]}, False)
    finally:
        print_driver_lines_with(printer)
    assert written == [{"lines": ["x"]}] and ray_worker.print_to_stdstream is printer


def test_ray_packaging_logs_under_the_quieted_name() -> None:
    from align.compat.ray import PACKAGING_LOGGER

    assert importlib.import_module(PACKAGING_LOGGER).default_logger.name == PACKAGING_LOGGER


def test_ray_asha_driven_without_a_tuner_stops_the_trial_that_lags() -> None:
    """ASHA judges stand-in trials (an id, no controller): at its first rung, of two trials the one whose
    loss is worse is stopped, the better one goes on."""
    from ray.tune.schedulers import ASHAScheduler

    from align.compat.ray import asha_add, asha_remove, asha_says_stop

    asha = ASHAScheduler(
        time_attr="step", metric="loss", mode="min", grace_period=2, reduction_factor=2, max_t=8
    )
    for trial in ("good", "bad"):
        asha_add(asha, trial)
    assert not asha_says_stop(asha, "good", {"step": 2, "loss": 0.1})
    assert asha_says_stop(asha, "bad", {"step": 2, "loss": 0.9})
    assert not asha_says_stop(asha, "good", {"step": 3, "loss": 0.05})
    asha_remove(asha, "bad")


PREPARE_READS = {
    "SFTTrainer": {"_tokenizer", "_is_vision_dataset", "chat_template", "completion_only_loss"},
    "DPOTrainer": {"_tokenizer", "_is_vision_dataset"},
    "KTOTrainer": {"_tokenizer", "_is_vision_dataset", "calculate_KL"}
    | {"desirable_weight", "undesirable_weight"},
    "RewardTrainer": {"_tokenizer", "_is_vision_dataset"},
}
"""What align's stand-in gives each trainer's `_prepare_dataset` of its `self` (align/compat/trl.py with
align/stages/prepared.py's attributes): the method must read nothing else."""


@pytest.mark.parametrize("name", sorted(PREPARE_READS))
def test_trl_prepare_dataset_reads_only_what_the_stand_in_holds(name: str) -> None:
    import trl

    method = getattr(trl, name)._prepare_dataset
    tail = ["packing", "formatting_func", "dataset_name"] if name == "SFTTrainer" else ["dataset_name"]
    leading = ["self", "dataset", "processing_class", "args"]
    assert list(inspect.signature(method).parameters) == [*leading, *tail]
    reads = set(re.findall(r"\bself\.(\w+)", inspect.getsource(method)))
    assert reads <= PREPARE_READS[name], sorted(reads - PREPARE_READS[name])


def test_trl_prepare_dataset_runs_on_the_stand_in() -> None:
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer

    from align.compat.trl import prepare_dataset
    from align.models.loading import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("tiny"))
    rows = Dataset.from_dict({"prompt": ["Hi there"], "completion": [" hello"]})
    config = trl.SFTConfig(output_dir="unused", max_length=None, report_to=[], use_cpu=True, bf16=False)
    attributes = {"chat_template": None, "completion_only_loss": True}
    prepared = prepare_dataset(trl.SFTTrainer, attributes, rows, tokenizer, config, "train")
    labels = prepared[0]["labels"]
    assert len(labels) == len(prepared[0]["input_ids"]) and labels[0] == -100 and labels[-1] != -100


@pytest.mark.parametrize("name", ["GRPOTrainer", "RLOOTrainer"])
def test_trl_online_trainers_keep_their_batch_and_run_both_rollout_steps(name: str) -> None:
    import trl

    trainer = getattr(trl, name)
    source = inspect.getsource(trainer)
    assert "self._logs = {" in source and '"completion"' in source and '"rewards"' in source
    for step in ("_generate", "_generate_and_score_completions"):
        assert step in vars(trainer), f"{name} no longer defines {step}"
        assert f"self.{step}(" in source, f"{name} no longer calls {step} on itself"
    assert not {"rollout_step", "rollout_split", "rollout_seconds"} & set(dir(trainer))


def test_the_rollout_steps_go_through_rollout_step() -> None:
    from align.compat.trl import RolloutSteps, kept_generation_batch

    class Base:
        def _generate(self, prompts):
            return ["sampled", *prompts]

        def _generate_and_score_completions(self, batch):
            return {"scored": self._generate(batch)}

    class Timed(RolloutSteps, Base):
        def __init__(self) -> None:
            self.parts: list[str] = []

        def rollout_step(self, part, step):
            self.parts.append(part)
            return step()

    trainer = Timed()
    assert trainer._generate_and_score_completions(["p"]) == {"scored": ["sampled", "p"]}
    assert trainer.parts == ["rollout", "generate"]
    assert kept_generation_batch(trainer) is None


def test_trl_fused_lm_head_calls_are_answered_by_the_route() -> None:
    import torch
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import FusedCausalLMOutput, add_fused_lm_head

    from align.compat.trl import answer_fused_lm_head
    from align.models.loading import resolve_model

    fields = {"loss", "log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1", "label_mask"}
    assert fields | {"aux_loss"} <= set(FusedCausalLMOutput.__dataclass_fields__)
    model = AutoModelForCausalLM.from_pretrained(resolve_model("tiny"), dtype=torch.float32)
    add_fused_lm_head(model)
    assert "fused_lm_head" in inspect.signature(model.forward).parameters or "fused_lm_head" in str(
        inspect.getsource(add_fused_lm_head)
    )
    seen = []
    answer_fused_lm_head(model, lambda model, outputs, *labels: seen.append((outputs.logits.shape, labels)))
    answer_fused_lm_head(model, lambda *args: None)  # twice: the first route stays
    ids = torch.randint(0, model.config.vocab_size, (1, 5))
    model(input_ids=ids, labels=ids, fused_lm_head=True)
    assert seen == [((1, 5, model.config.vocab_size), (ids, None, None))]
    assert model(input_ids=ids).logits.shape == (1, 5, model.config.vocab_size)


def test_peft_layer_switches_are_the_attributes_its_properties_read() -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from peft.tuners.tuners_utils import BaseTunerLayer

    from align.compat.peft import lora_switches

    torch.manual_seed(0)
    model = get_peft_model(torch.nn.Sequential(torch.nn.Linear(4, 4)), LoraConfig(target_modules=["0"]))
    layer = next(module for module in model.modules() if isinstance(module, BaseTunerLayer))
    torch.nn.init.ones_(layer.lora_B["default"].weight)
    grads = [param.requires_grad for param in model.parameters()]
    x = torch.ones(1, 4)
    with torch.no_grad():
        on, base = model(x), layer.base_layer(x)
        with lora_switches(model, disabled=True):
            assert layer.disable_adapters and layer.active_adapters == ["default"]
            torch.testing.assert_close(model(x), base)
        with lora_switches(model, active="other"):
            assert layer.active_adapters == ["other"] and not layer.disable_adapters
            torch.testing.assert_close(model(x), base)  # no such adapter: none runs
        torch.testing.assert_close(model(x), on)
    assert [param.requires_grad for param in model.parameters()] == grads


def test_transformers_trainer_has_the_private_steps_the_hooks_replace() -> None:
    from transformers import Trainer

    from align.compat.transformers import HookedTrainer

    expected = {
        "_prepare_inputs": ["self", "inputs"],
        "_save": ["self", "output_dir", "state_dict"],
        "_save_checkpoint": ["self", "model", "trial"],
        "_load_from_checkpoint": ["self", "resume_from_checkpoint", "model"],
        "_get_output_dir": ["self", "trial"],
    }
    for name, parameters in expected.items():
        assert list(inspect.signature(getattr(Trainer, name)).parameters) == parameters, name
    saving = inspect.getsource(Trainer._save_checkpoint)
    assert 'f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"' in saving
    assert "self._get_output_dir(trial=trial)" in saving
    for hook in ("batch_from", "write_model", "before_checkpoint", "load_checkpoint_weights"):
        assert not hasattr(Trainer, hook) and hasattr(HookedTrainer, hook)
