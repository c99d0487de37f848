"""A subsystem's models/ directory: its models read back, made, turned into another
kind and removed, each as one kind of `mlfs.core.models.kinds`.

`mkdir` builds a model directory under a temporary name and renames it into place,
so a crash never leaves half a model; a model's kind is in its `kind` file (absent in
a directory older than kinds: the subsystem's first kind, as before).  A directory
being replaced (`kind` written) is renamed aside first and removed after, and
anything left under either temporary prefix by a crash is removed at start-up.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from pathlib import Path

from mlfs.abi import NAME
from mlfs.base.durable import fsync_dir, write_durably
from mlfs.base.errors import Refused, busy, invalid
from mlfs.base.portion import errno_name
from mlfs.base.statedir import read_word
from mlfs.base.text import one_word
from mlfs.core.models.kinds import KIND_FILE, KINDS
from mlfs.core.models.model_files import MODEL_SETTINGS, prepare_model_directory
from mlfs.core.models.proxy import ModelProxy

log = logging.getLogger("mlfs.runtime")

#: a model directory under construction (mkdir): never loaded, removed at start-up
NEW_PREFIX = ".new-"
#: a model directory being replaced by one of another kind: removed at start-up
OLD_PREFIX = ".old-"


def load_models(runtime, models_dir: Path) -> dict[str, ModelProxy]:
    """The models a previous run left, each as its kind; incomplete ones are ignored."""
    models: dict[str, ModelProxy] = {}
    for entry in sorted(models_dir.iterdir()):
        if entry.name.startswith((NEW_PREFIX, OLD_PREFIX)):  # a mkdir that never returned
            shutil.rmtree(entry, ignore_errors=True)
        elif entry.is_dir() and NAME.fullmatch(entry.name):
            if not (entry / MODEL_SETTINGS).exists():
                log.warning("%s: %s has no %s (not a complete model); ignored",
                            runtime.name, entry, MODEL_SETTINGS)
                continue
            kind, why = read_word(entry / KIND_FILE)
            if kind is None and not why:
                kind = runtime.kinds[0] if runtime.kinds else None
            if kind not in runtime.kinds:
                log.warning("%s: %s is of kind %r, which %s does not serve (%s); ignored",
                            runtime.name, entry, kind, runtime.name,
                            why or f"serves {', '.join(runtime.kinds) or 'none'}")
                continue
            models[entry.name] = KINDS[kind].proxy(runtime, entry.name, entry,
                                                   runtime.mount.new_generation())
    return models


def _build(runtime, name: str, kind: str, staging: Path, directory: Path,
           replacing: Path | None = None, generation: int | None = None) -> ModelProxy:
    """Lay out `staging` as a new model of `kind`, rename it to `directory`, open it."""
    proxy_class = KINDS[kind].proxy
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    write_durably(staging / KIND_FILE, f"{kind}\n".encode())
    prepare_model_directory(staging, proxy_class.default_controlled(runtime.subsystem))
    if replacing is not None:
        os.rename(directory, replacing)
    os.rename(staging, directory)
    fsync_dir(directory.parent)
    if replacing is not None:
        shutil.rmtree(replacing, ignore_errors=True)
    if generation is None:
        generation = runtime.mount.new_generation()
    return proxy_class(runtime, name, directory, generation)


def create_model(runtime, name: str, kind: str | None = None) -> ModelProxy:
    """mkdir: a complete model directory appears by one rename, or nothing does.

    The directory is built under a temporary name (its settings file last) and
    renamed into place, so a crash or an error half-way (EMFILE, ENOSPC) never
    leaves something that comes back as a model.
    """
    if not NAME.fullmatch(name):
        raise invalid(f"model name {name!r} is not [a-z0-9][a-z0-9._-]{{0,63}}")
    if runtime.unloading:
        raise Refused(errno.ENODEV, f"subsystem {runtime.name!r} is being unloaded")
    if name in runtime.models:
        raise Refused(errno.EEXIST, f"model {name!r} exists")
    if not runtime.kinds:
        raise Refused(errno.EPERM, f"{runtime.name} serves no kind of model")
    limit = runtime.mount.config.mount.max_models
    if runtime.mount.model_count() >= limit:
        raise Refused(errno.ENOSPC, f"the mount has {limit} models (mount.max_models)")
    models_dir = runtime.directory / "models"
    directory = models_dir / name
    staging = models_dir / (NEW_PREFIX + name)
    try:
        if directory.exists():  # left by an rmdir that crashed half-way
            shutil.rmtree(directory)
        proxy = _build(runtime, name, kind or runtime.kinds[0], staging, directory)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(directory, ignore_errors=True)
        log.warning("%s: mkdir %s failed: %s", runtime.name, name, exc)
        raise Refused(exc.errno or errno.EIO, f"model {name!r} not created: "
                      f"{errno_name(exc)} in the state directory") from None
    runtime.models[name] = proxy
    runtime.models_changed()
    runtime.mount.bus.publish(runtime.name, "state", model=name,
                              **{"from": None, "to": "initialized"})
    return proxy


def change_kind(runtime, proxy: ModelProxy, data: bytes) -> ModelProxy:
    """A write to a model's `kind`: a model never started becomes a new model of
    another kind the subsystem serves (EINVAL: not one; EBUSY: it was started)."""
    try:
        kind = one_word(data, "kind")
        if kind not in runtime.kinds:
            raise invalid(f"{runtime.name} serves {' '.join(runtime.kinds)}, not {kind!r}")
        if kind != proxy.kind and proxy.state != "initialized":
            raise busy(f"model is {proxy.state}: only a model never started changes kind")
    except Refused as exc:
        raise proxy.refuse("kind", data, exc) from None
    if kind == proxy.kind or runtime.models.get(proxy.name) is not proxy:
        return proxy
    models_dir = proxy.directory.parent
    proxy.destroy()
    try:
        new = _build(runtime, proxy.name, kind, models_dir / (NEW_PREFIX + proxy.name),
                     proxy.directory, models_dir / (OLD_PREFIX + proxy.name),
                     proxy.generation)  # the same model (and directory node), another kind
    except OSError as exc:
        runtime.models.pop(proxy.name, None)
        runtime.models_changed()
        log.warning("%s: %s as a %s failed: %s", runtime.name, proxy.name, kind, exc)
        raise Refused(exc.errno or errno.EIO, f"model {proxy.name!r} lost making it a "
                      f"{kind}: {errno_name(exc)} in the state directory") from None
    runtime.models[proxy.name] = new
    runtime.models_changed()
    runtime.mount.bus.publish(runtime.name, "kind", model=proxy.name,
                              **{"from": proxy.kind, "to": kind})
    return new


def destroy_model(runtime, name: str) -> ModelProxy:
    """rmdir: stop, seal what it has, forget it (its state files go too)."""
    proxy = runtime.models.pop(name, None)
    if proxy is None:
        raise Refused(errno.ENOENT, f"no model {name!r}")
    runtime.models_changed()
    proxy.destroy()
    shutil.rmtree(proxy.directory, ignore_errors=True)
    runtime.mount.bus.publish(runtime.name, "state", model=name,
                              **{"from": proxy.state, "to": None})
    return proxy
