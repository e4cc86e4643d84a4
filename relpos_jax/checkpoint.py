"""The one orbax wrapper: model + optimizer state, segment memory, data iterator and step.

Orbax writes each checkpoint into a temporary folder and renames it when complete, so a run killed
mid-save leaves the previous checkpoint intact; the last ``keep`` are kept.

Restoring goes from the newest checkpoint to the oldest. Before reading any array it checks that the
checkpoint was written by a compatible config (the config fields saved with it, then every array's
path and shape): a mismatch is the user's to fix and ends in one line naming the field. A checkpoint
that cannot be read (truncated, corrupt, half-deleted) is reported, moved to ``corrupt/`` next to the
checkpoints folder (nothing is deleted), and the one before it is used.

A checkpoint in an older layout is read as it was written and laid out as today's model: layers one
by one (``blocks/3/attention/w_q``, written before the layers became one scan over stacked
parameters) are stacked (``layers.stack_layer_paths``), and a scheme's parameters held on the
attention or the model itself (``attention/w_r``, ``u``: before they were its child ``position``)
are read under their paths (``layers.positioned_paths``). It resumes and evaluates as it did; the
next save is in today's layout.
"""

from __future__ import annotations

import pathlib
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from relpos_jax import layers, schemes
from relpos_jax.config import ConfigError
from relpos_jax.sharding import path_string

# Config fields a checkpoint must agree on: they decide the shapes of the parameters, optimizer and
# memory, or what the saved data position means; and the scheme's own settings that it names
# (``Scheme.must_match``: ``model.shaw.max_distance`` …). The others (dropout, dtype, clamp_len, lr,
# steps…) may change when a run resumes.
MUST_MATCH = {
    "model": (
        "position", "vocab_size", "n_layers", "d_model", "n_heads", "d_head", "d_ff", "mem_len",
        "pre_norm", "tie_embeddings", "output_bias",
    ),
    "data": (
        "name", "path", "tokens", "vocab", "partition", "python", "segment_len", "batch_size",
    ),
}  # fmt: skip


class CheckpointError(ValueError):
    """No checkpoint in a folder can be read; one line saying what was tried and what to do."""


class _Unreadable(Exception):
    """A checkpoint whose files cannot be read (the caller falls back to an older one)."""


def _storable(mems: Any) -> dict[str, Any]:
    """Memory as a dict; a memory of length 0 (no recurrence) has no states to store."""
    return {"valid": mems.valid} | ({"states": mems.states} if mems.states.size else {})


def _shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    """{"a/b/c": shape} for every array (or array metadata) leaf of ``tree``."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {path_string(path): _stored_shape(leaf) for path, leaf in leaves}


def _stored_shape(leaf: Any) -> tuple[int, ...]:
    """A typed PRNG key is stored as its raw key data (e.g. shape () -> (2,))."""
    if jax.dtypes.issubdtype(getattr(leaf, "dtype", None), jax.dtypes.prng_key):
        return tuple(jax.random.key_data(leaf).shape)
    return tuple(leaf.shape)


def sections(config: Any) -> dict[str, dict[str, Any]]:
    """The ``MUST_MATCH`` fields of a validated Config, as saved in each checkpoint's meta, with its
    scheme's ``must_match`` settings under dotted names (``"shaw.max_distance"``)."""
    saved = {
        name: {field: getattr(getattr(config, name), field) for field in fields}
        for name, fields in MUST_MATCH.items()
    }
    scheme = schemes.get(config.model.position)
    own = scheme.settings(config.model) if scheme.must_match else {}
    saved["model"].update({f"{scheme.name}.{field}": own[field] for field in scheme.must_match})
    saved["data"]["python"] = config.data.corpus_python  # pystdlib's, resolved (unset: this one)
    return saved


def _former_names(field: str) -> list[str]:
    """A model field and the flat names it had before its scheme owned it (``shaw_max_distance``)."""
    return [field, *(old for old, new in schemes.renamed_fields().items() if new == field)]


def _today(saved: dict[str, Any], state: Any, stack: Any = np.stack) -> dict[str, Any]:
    """A checkpoint's arrays (or shapes, with ``stack=layers.stacked_shape``) by path, under the
    paths of today's ``state``: layers stacked, a scheme's parameters in ``position``."""
    return layers.positioned_paths(layers.stack_layer_paths(saved, stack), _shapes(state))


def _saved_value(saved: Mapping, section: str, field: str, value: Any) -> Any:
    """What a checkpoint's config held for a field; for pystdlib's partition, which older
    checkpoints did not record, the one they ran with ("hash"); it means nothing for other corpora.
    Older checkpoints did not record pystdlib's Python either: any is taken to match."""
    data = saved.get("data", {})
    if (section, field) == ("data", "partition"):
        return data.get(field, "hash") if data.get("name") == "pystdlib" else value
    if section == "model":  # a scheme's setting: saved under its former flat name by older runs
        model = saved.get("model", {})
        return next((model[name] for name in _former_names(field) if name in model), value)
    return saved.get(section, {}).get(field, value)


def _predating(saved: Mapping, config: Any) -> str:
    """What a shape mismatch adds when the checkpoint's saved config lacks settings of the config's
    scheme that decide shapes (``must_match``): it was written before they existed (KERPLE's
    parameters per layer, before ``model.kerple.per_layer``, whose default now shares them)."""
    model = saved.get("model")
    if not isinstance(model, Mapping):
        return ""
    scheme = schemes.get(config.model.position)
    fields = [f"{scheme.name}.{field}" for field in scheme.must_match]
    missing = [f"model.{f}" for f in fields if not any(n in model for n in _former_names(f))]
    if not missing:
        return ""
    return f"; it was written before {', '.join(missing)} existed: set the value its shapes need"


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200]}" if text else type(error).__name__


def warn(message: str) -> None:
    if jax.process_index() == 0:
        print(f"warning: {message}", file=sys.stderr, flush=True)


class Checkpointer:
    def __init__(self, directory: str | pathlib.Path, *, keep: int = 3):
        self.directory = pathlib.Path(directory).resolve()
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
        handlers = {
            "state": ocp.StandardCheckpointHandler(),
            "mems": ocp.StandardCheckpointHandler(),
            "data": ocp.JsonCheckpointHandler(),
            "meta": ocp.JsonCheckpointHandler(),
        }
        self.manager = ocp.CheckpointManager(
            self.directory, options=options, item_handlers=handlers
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, *, state: Any, mems: Any, data: dict, meta: dict) -> None:
        self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state),
                mems=ocp.args.StandardSave(_storable(mems)),
                data=ocp.args.JsonSave(data),
                meta=ocp.args.JsonSave(meta),
            ),
        )

    def restore(self, step: int, *, state: Any, mems: Any) -> dict[str, Any]:
        """Restore into the structure (and shardings) of ``state`` and ``mems``."""
        unrolled = self._older_layout(step, state)
        items = dict(
            mems=ocp.args.StandardRestore(_storable(mems)),
            data=ocp.args.JsonRestore(),
            meta=ocp.args.JsonRestore(),
        )
        if not unrolled:
            items["state"] = ocp.args.StandardRestore(state)
        restored = dict(self.manager.restore(step, args=ocp.args.Composite(**items)))
        if unrolled:
            restored["state"] = self._restore_older(step, state)
        saved = restored["mems"]
        restored["mems"] = type(mems)(saved.get("states", mems.states), saved["valid"])
        return restored

    def restore_params(self, step: int, state: Any) -> Any:
        """The part of the ``state`` item that ``state`` names, e.g. ``{0: model_state}``: evaluation
        needs neither the optimizer (whatever its structure), nor the memory, nor the data. The
        arrays come back with the shardings of ``state``'s, whatever devices wrote them (a run on
        one CPU device per core, read by a process with one device)."""
        if self._older_layout(step, state):
            return self._restore_older(step, state)
        reader = ocp.CheckpointManager(
            self.directory, item_handlers={"state": ocp.PyTreeCheckpointHandler()}
        )
        args = ocp.args.PyTreeRestore(
            item=state,
            restore_args=ocp.checkpoint_utils.construct_restore_args(state),
            partial_restore=True,
        )
        try:
            return reader.restore(step, args=ocp.args.Composite(state=args))["state"]
        finally:
            reader.close()

    def _older_layout(self, step: int, state: Any) -> bool:
        """Whether checkpoint ``step`` names its layers one by one (``blocks/<l>/…``) or holds a
        scheme's parameters outside ``position`` (``_today``)."""
        saved = _shapes(self.manager.item_metadata(step)["state"].tree)
        return layers.has_layer_paths(saved) or set(
            _today(saved, state, layers.stacked_shape)
        ) != set(saved)

    def _restore_older(self, step: int, state: Any) -> Any:
        """The part of checkpoint ``step``'s state item that ``state`` names, from a checkpoint in
        an older layout: read as written (numpy), laid out as ``state`` (``_today``)."""
        tree = self.manager.item_metadata(step)["state"].tree
        as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
        reader = ocp.CheckpointManager(
            self.directory, item_handlers={"state": ocp.PyTreeCheckpointHandler()}
        )
        try:
            args = ocp.args.PyTreeRestore(restore_args=as_numpy)
            raw = reader.restore(step, args=ocp.args.Composite(state=args))["state"]
        finally:
            reader.close()
        leaves = jax.tree_util.tree_flatten_with_path(raw)[0]
        written = {path_string(path): a for path, a in leaves}
        arrays = _today(written, state)
        older = ["its layers one by one"] if layers.has_layer_paths(written) else []
        if set(layers.stack_layer_paths(written)) != set(arrays):
            older.append("its scheme's parameters outside position/")
        warn(
            f"the checkpoint at step {step} in {self.directory} holds {' and '.join(older)}; "
            "read in today's layout (the next checkpoint is saved so)"
        )

        def fill(path, target):
            array = arrays[path_string(path)]
            if jax.dtypes.issubdtype(target.dtype, jax.dtypes.prng_key):
                array = jax.random.wrap_key_data(array, impl=jax.random.key_impl(target))
            else:
                array = array.astype(target.dtype)
            return jax.device_put(array, target.sharding)

        return jax.tree_util.tree_map_with_path(fill, state)

    def check_compatible(
        self, step: int, state: Any, config: Any, *, partial: bool = False
    ) -> None:
        """ConfigError naming the field when checkpoint ``step`` was written by another config;
        ``_Unreadable`` when its metadata cannot be read. ``partial``: ``state`` is the model part
        of what was saved (evaluation): its arrays and the model's fields must match, not the rest
        (optimizer, memory length, data layout)."""
        try:
            meta = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))[
                "meta"
            ]
            saved_shapes = _shapes(self.manager.item_metadata(step)["state"].tree)
        except Exception as error:  # any failure to read: unreadable
            raise _Unreadable(_first_line(error)) from error
        saved_shapes = _today(saved_shapes, state, layers.stacked_shape)
        where = f"the checkpoint at step {step} in {self.directory}"
        saved = meta.get("config", {}) if isinstance(meta.get("config"), Mapping) else {}
        for section, values in sections(config).items():
            for field, value in values.items():
                if partial and (section != "model" or field == "mem_len"):
                    continue
                was = _saved_value(saved, section, field, value)
                if was != value:
                    raise ConfigError(
                        f"{section}.{field}={value!r} is invalid; {where} was written with "
                        f"{section}.{field}={was!r}: use that value to resume, "
                        "or another --workdir to start a new run"
                    )
        shapes = _shapes(state)
        for path in sorted(set(shapes) if partial else set(shapes) | set(saved_shapes)):
            if shapes.get(path) != saved_shapes.get(path):
                raise ConfigError(
                    f"config={path!r} is invalid; {where} holds {path} with shape "
                    f"{saved_shapes.get(path, 'absent')}, this config makes "
                    f"{shapes.get(path, 'absent')}: resume with the config that wrote it "
                    "(train.clip, train.optimizer and the model fields"
                    f"{_predating(saved, config)}), or use another --workdir"
                )

    def restore_newest(
        self,
        read: Callable[[int], Any],
        *,
        state: Any,
        config: Any,
        set_aside: bool,
        partial: bool = False,
    ) -> tuple[int, Any] | None:
        """``(step, read(step))`` for the newest checkpoint that is compatible and readable.

        An unreadable one is reported and, with ``set_aside``, moved to ``corrupt/`` so that the
        run continues from the one before it. None when the folder holds no checkpoint; a
        CheckpointError (nothing moved) when none of them can be read.
        """
        steps = sorted(self.manager.all_steps(), reverse=True)
        failures = []
        for step in steps:
            try:
                self.check_compatible(step, state, config, partial=partial)
                restored = read(step)
            except ConfigError:
                raise
            except Exception as error:  # unreadable: try the one before
                reason = str(error) if isinstance(error, _Unreadable) else _first_line(error)
                failures.append((step, reason))
                continue
            for bad, reason in failures:
                moved = self._set_aside(bad) if set_aside else None
                warn(
                    f"the checkpoint at step {bad} in {self.directory} cannot be read ({reason}); "
                    + (f"moved it to {moved}; " if moved else "")
                    + f"using step {step}"
                )
            return step, restored
        if failures:
            step, reason = failures[0]
            raise CheckpointError(
                f"checkpoint={str(self.directory)!r} is invalid; none of its {len(steps)} "
                f"checkpoints can be read (step {step}: {reason}); move the folder away to start "
                "a new run"
            )
        return None

    def _set_aside(self, step: int) -> pathlib.Path | None:
        if jax.process_index() != 0:
            return None
        target = self.directory.parent / "corrupt" / f"{step}-{time.strftime('%Y%m%d-%H%M%S')}"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(self.directory / str(step)), target)
        self.manager.reload()
        return target

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()


def latest_step(directory: str | pathlib.Path) -> int | None:
    """The newest complete checkpoint under ``directory`` without creating anything (or None)."""
    path = pathlib.Path(directory)
    steps = (
        [int(p.name) for p in path.iterdir() if p.is_dir() and p.name.isdigit()]
        if path.is_dir()
        else []
    )
    return max(steps, default=None)


def restore_run_model(
    workdir: str | pathlib.Path, model_state: Any, config: Any, *, field: str, fix: str
) -> tuple[int, Any]:
    """``(step, model state)`` of the newest readable checkpoint of the run in ``workdir``, laid out
    as ``model_state`` (the model half of the saved (model, optimizer); the model fields must
    match ``config``). A folder without a checkpoint is one line naming ``field`` and ``fix``."""
    directory = pathlib.Path(workdir).expanduser() / "checkpoints"
    if latest_step(directory) is None:
        raise ConfigError(f"{field}={str(workdir)!r} is invalid; it holds no checkpoint, {fix}")
    target = {0: model_state}
    checkpointer = Checkpointer(directory)
    step, restored = checkpointer.restore_newest(
        lambda s: checkpointer.restore_params(s, target),
        state=target, config=config, set_aside=False, partial=True,
    )  # fmt: skip
    return step, restored[0]
