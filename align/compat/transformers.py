"""transformers' private code that align uses: the Trainer's private steps a trainer of its own replaces,
behind named hooks. Imports transformers (only align/trainers/ imports this module, in a worker)."""

from __future__ import annotations

import os
from typing import Any

from transformers import Trainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from align.compat.versions import check_version

WRITTEN_FOR = ">=5.24,<5.25"
check_version("transformers", WRITTEN_FOR)


class HookedTrainer(Trainer):
    """The Trainer with the private steps a subclass needs behind hooks of their own names: override the
    hook; each defaults to the Trainer's own step."""

    def batch_from(self, inputs: Any) -> Any:
        """The micro-batch the training step runs on, from what the data loader gave (`_prepare_inputs`)."""
        return super()._prepare_inputs(inputs)

    def write_model(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """Write the model's files to `output_dir` (`_save`, which `save_model` and checkpoints call)."""
        super()._save(output_dir, state_dict=state_dict)

    def before_checkpoint(self, folder: str) -> None:
        """Called as a checkpoint is about to be written to `folder`, before the Trainer writes any of it
        (its `trainer_state.json` last, which marks the folder complete)."""

    def load_checkpoint_weights(self, folder: str, model: Any = None) -> None:
        """Load the weights of the checkpoint in `folder` as training resumes (`_load_from_checkpoint`)."""
        super()._load_from_checkpoint(folder, model)

    def _prepare_inputs(self, inputs: Any) -> Any:
        return self.batch_from(inputs)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        self.write_model(output_dir, state_dict)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        step = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        folder = os.path.join(self._get_output_dir(trial), step)
        self.before_checkpoint(folder)
        super()._save_checkpoint(model, trial)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        self.load_checkpoint_weights(resume_from_checkpoint, model)
