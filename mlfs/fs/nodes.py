"""The mount's tree, as node objects over the FUSE-free core.

Each kind of file is served one way (see docs/fuse-notes.md): text attributes are
snapshots served direct_io; Parquet portions are immutable page-cached files
with exact sizes; event streams are per-open cursors.  Inode numbers come from
one counter and are never reused, so `keep_cache` can never serve a dead
file's pages; a node that disappeared answers ENOENT.
"""

from __future__ import annotations

import functools
import itertools
import json
import stat
from collections.abc import Awaitable, Callable, Mapping

from mlfs.base.errors import Refused
from mlfs.base.hostid import host_id
from mlfs.base.portion import Portion
from mlfs.core.models.kinds import kind_of
from mlfs.core.models.proxy import ModelProxy
from mlfs.core.mount.control import Control
from mlfs.core.mount.runtime import SubsystemRuntime

ReadFn = Callable[[], "str | bytes"]
#: a write's call into the core (`Control`): a coroutine, or done when it returns
WriteFn = Callable[..., "Awaitable[None] | None"]

# attribute and entry timeouts (seconds): immutable things are cached long,
# things that change or can be removed short (docs/fuse-notes.md: timeouts)
IMMUTABLE_TIMEOUT = 300.0
REMOVABLE_ENTRY_TIMEOUT = 1.0
ATTR_TIMEOUT = 1.0


class Node:
    kind = "node"

    def __init__(self, tree: Tree, name: str, parent: Dir | None) -> None:
        self.tree = tree
        self.ino = tree.register(self)
        self.name = name
        self.parent = parent

    def alive(self) -> bool:
        return self.parent is None or self.parent.alive()

    @property
    def path(self) -> str:
        if self.parent is None:
            return ""
        prefix = self.parent.path
        return f"{prefix}/{self.name}" if prefix else self.name

    def mode(self) -> int:
        return stat.S_IFREG | 0o444

    def size(self) -> int:
        return 0

    def mtime_ns(self) -> int:
        return self.tree.started_ns

    attr_timeout = ATTR_TIMEOUT
    entry_timeout = ATTR_TIMEOUT


class Dir(Node):
    kind = "dir"
    entry_timeout = REMOVABLE_ENTRY_TIMEOUT

    def __init__(self, tree: Tree, name: str, parent: Dir | None) -> None:
        super().__init__(tree, name, parent)
        self.fixed: dict[str, Node] = {}

    def mode(self) -> int:
        return stat.S_IFDIR | 0o755

    def add(self, node: Node) -> Node:
        self.fixed[node.name] = node
        return node

    def children(self) -> dict[str, Node]:
        return self.fixed

    def lookup(self, name: str) -> Node | None:
        return self.children().get(name)


class Attr(Node):
    """A sysfs-style attribute: read gives a fresh snapshot, write one whole value."""

    kind = "attr"

    def __init__(self, tree: Tree, name: str, parent: Dir, read: ReadFn | None = None,
                 write: WriteFn | None = None, *, buffered: bool = False,
                 caller: bool = False,
                 refused: Callable[[int, str, bytes], object] | None = None) -> None:
        super().__init__(tree, name, parent)
        self.read = read
        self.write = write
        #: `refused(errno, reason, data)`: a write the FUSE layer refuses before the core
        #: sees it (a buffered write past its bound), recorded where the core's show
        self.refused = refused
        #: `write` takes the writer's uid too (recorded at open: write has no ctx)
        self.caller = caller
        #: the writes of a buffered attribute (policy) are committed on close
        self.buffered = buffered

    def mode(self) -> int:
        group = self.tree.group_writable
        if self.read and self.write:
            bits = 0o664 if group else 0o644
        elif self.write:
            bits = 0o220 if group else 0o200
        else:
            bits = 0o444
        return stat.S_IFREG | bits

    def size(self) -> int:
        return 4096 if self.read else 0


class EventsFile(Node):
    kind = "events"

    def __init__(self, tree: Tree, name: str, parent: Dir, subsystem: str | None) -> None:
        super().__init__(tree, name, parent)
        self.subsystem = subsystem

    def mode(self) -> int:
        return stat.S_IFREG | 0o444


class PortionFile(Node):
    kind = "portion"
    attr_timeout = IMMUTABLE_TIMEOUT
    entry_timeout = REMOVABLE_ENTRY_TIMEOUT

    def __init__(self, tree: Tree, parent: PortionDir, portion: Portion) -> None:
        super().__init__(tree, portion.name, parent)
        self.portion = portion
        self.portions = parent.portions
        self.private = parent.private

    def alive(self) -> bool:
        return (self.portions.get(self.portion.number) is self.portion
                and self.parent.alive())

    def mode(self) -> int:
        return stat.S_IFREG | (0o440 if self.private else 0o444)

    def size(self) -> int:
        return self.portion.size

    def mtime_ns(self) -> int:
        return self.portion.mtime_ns


class PortionDir(Dir):
    """dataset/, records/, feedback/, recommendations/: a view of one store's portions."""

    def __init__(self, tree: Tree, name: str, parent: Dir, portions: Mapping[int, Portion],
                 private: bool = False) -> None:
        super().__init__(tree, name, parent)
        #: the store's sealed portions by number (a live read-only view)
        self.portions = portions
        #: what the subsystem publishes identifies users: root and the group only (0440)
        self.private = private
        self._nodes: dict[int, PortionFile] = {}

    def children(self) -> dict[str, Node]:
        portions = self.portions
        for number in [n for n in self._nodes if n not in portions]:
            self._nodes.pop(number)  # its inode stays dead: alive() is False
        out: dict[str, Node] = {}
        for number in sorted(portions):
            node = self._nodes.get(number)
            if node is None or node.portion is not portions[number]:
                node = self._nodes[number] = PortionFile(self.tree, self, portions[number])
            out[node.name] = node
        return out


class ReadOnlyAttr(Attr):
    """A read-only attribute of a subsystem whose data may be private (0440 then, as
    its dataset): a snapshot per open."""

    def __init__(self, tree: Tree, name: str, parent: Dir, read: ReadFn, private: bool) -> None:
        super().__init__(tree, name, parent, read=read)
        self.private = private

    def mode(self) -> int:
        return stat.S_IFREG | (0o440 if self.private else 0o444)


class ReportFile(ReadOnlyAttr):
    """One report (a signature's title, counts and first block)."""


class ReportsDir(Dir):
    """reports/: one read-only file per report the backend keeps (bounded by it)."""

    def __init__(self, tree: Tree, parent: Dir, runtime: SubsystemRuntime) -> None:
        super().__init__(tree, "reports", parent)
        self.runtime = runtime
        self._nodes: dict[str, ReportFile] = {}

    def children(self) -> dict[str, Node]:
        subsystem = self.runtime.subsystem
        names = sorted(subsystem.report_files())
        out: dict[str, Node] = {}
        for name in names:
            node = self._nodes.get(name)
            if node is None:
                node = self._nodes[name] = ReportFile(
                    self.tree, name, self,
                    lambda n=name: subsystem.report_files().get(n, ""), subsystem.private)
            out[name] = node
        return out


class ModelFiles(Dir):
    """The files of one model proxy, shown in its `ModelDir`.  Writing `kind` replaces
    the proxy (a model never started becomes another kind) but not the directory: the
    directory then shows a new `ModelFiles`, and this one's nodes are dead (ENOENT)."""

    def __init__(self, tree: Tree, parent: ModelDir, proxy: ModelProxy) -> None:
        super().__init__(tree, proxy.name, parent)
        self.proxy = proxy
        control = tree.control
        add = self.add
        add(Attr(tree, "control", self, write=lambda d: control.model_control(proxy, d)))
        add(Attr(tree, "state", self, read=lambda: proxy.state + "\n"))
        add(Attr(tree, "kind", self, read=lambda: proxy.kind + "\n",
                 write=lambda d: control.set_kind(proxy, d)))
        add(Attr(tree, "mode", self, read=lambda: proxy.mode + "\n",
                 write=lambda d, uid: control.set_mode(proxy, d, uid), caller=True))
        add(Attr(tree, "mode_switching", self, read=lambda: proxy.mode_switching + "\n"))
        add(Attr(tree, "recommend", self, write=lambda d: control.recommend(proxy, d)))
        add(Attr(tree, "policy", self, read=proxy.policy_text,
                 write=lambda d: control.upload_policy(proxy, d), buffered=True,
                 refused=lambda code, reason, d: proxy.refuse("policy", d, Refused(code, reason))))
        add(Attr(tree, "efficiency", self, read=proxy.efficiency_text))
        add(Attr(tree, "efficiency_vs_incumbent", self, read=proxy.incumbent.versus_text))
        add(Attr(tree, "incumbent", self, read=proxy.incumbent.file_text))
        add(Attr(tree, "errors", self, read=proxy.errors_text))
        for file in kind_of(proxy).files:  # the kind's own files (kinds.ModelKind.files)
            add(Attr(tree, file.name, self,
                     read=None if file.read is None else functools.partial(file.read, proxy),
                     write=None if file.write is None
                     else functools.partial(file.write, control, proxy)))
        for name, portions in proxy.portion_views().items():
            add(PortionDir(tree, name, self, portions))
        for node in self.fixed.values():  # looked up on every path walk: after a write to
            node.entry_timeout = 0.0  # `kind` the kernel must not keep the old kind's files

    @property
    def path(self) -> str:
        return self.parent.path

    def alive(self) -> bool:
        return self.parent.files is self and self.parent.alive()


class ModelDir(Dir):
    """One model's directory: the same node while the model lives, whatever its kind."""

    def __init__(self, tree: Tree, parent: ModelsDir, proxy: ModelProxy) -> None:
        super().__init__(tree, proxy.name, parent)
        #: the model's identity: a kind change keeps it, a re-created model gets a new one
        self.generation = proxy.generation
        self.files = ModelFiles(tree, self, proxy)

    @property
    def proxy(self) -> ModelProxy:
        return self.files.proxy

    def current(self) -> ModelProxy | None:
        proxy = self.parent.runtime.models.get(self.name)
        return proxy if proxy is not None and proxy.generation == self.generation else None

    def children(self) -> dict[str, Node]:
        proxy = self.current()
        if proxy is not None and proxy is not self.files.proxy:  # its kind changed
            self.files = ModelFiles(self.tree, self, proxy)
        return self.files.fixed

    def alive(self) -> bool:
        return self.current() is not None and self.parent.alive()


class ModelsDir(Dir):
    """models/: configfs-style, mkdir creates a proxy and rmdir destroys it."""

    def __init__(self, tree: Tree, parent: Dir, runtime: SubsystemRuntime) -> None:
        super().__init__(tree, "models", parent)
        self.runtime = runtime
        self._nodes: dict[str, ModelDir] = {}

    def mode(self) -> int:
        return stat.S_IFDIR | (0o775 if self.tree.group_writable else 0o755)

    def children(self) -> dict[str, Node]:
        models = self.runtime.models
        out: dict[str, Node] = {}
        for name in [n for n in self._nodes if self._nodes[n].current() is None]:
            self._nodes.pop(name)
        for name in sorted(models):
            node = self._nodes.get(name)
            if node is None:
                node = self._nodes[name] = ModelDir(self.tree, self, models[name])
            out[name] = node
        return out


class SubsystemDir(Dir):
    def __init__(self, tree: Tree, parent: Dir, runtime: SubsystemRuntime) -> None:
        super().__init__(tree, runtime.name, parent)
        self.runtime = runtime
        control = tree.control
        self.add(Attr(tree, "info", self, read=lambda: _json(runtime.info())))
        self.add(Attr(tree, "control", self,
                      write=lambda d: control.subsystem_control(runtime, d)))
        self.add(Attr(tree, "objective", self, read=runtime.objective_text,
                      write=lambda d: control.write_objective(runtime, d)))
        knobs = self.add(Dir(tree, "knobs", self))
        for name in runtime.subsystem.knobs:
            knobs.add(Attr(tree, name, knobs, read=functools.partial(runtime.knob_text, name)))
        self.add(EventsFile(tree, "events", self, runtime.name))
        private = runtime.subsystem.private
        self.add(ReadOnlyAttr(tree, "features", self, runtime.features_text, private))
        # dataset/, and records/ for a record source (many rows per tick, or none)
        for name, portions in runtime.portion_views().items():
            self.add(PortionDir(tree, name, self, portions, private))
        if runtime.subsystem.publishes_reports:
            self.add(ReportsDir(tree, self, runtime))
        self.add(ModelsDir(tree, self, runtime))

    def alive(self) -> bool:
        """Served while its runtime is: after an unload every node under it is gone."""
        return self.tree.exchange.runtimes.get(self.name) is self.runtime


class RootDir(Dir):
    """The mount's root: its own files, then one directory per served subsystem.

    Subsystems come and go at run time (load/unload, mkdir/rmdir): a
    directory node is made the first time its runtime is seen and dropped
    when the runtime is gone (its inodes stay dead, never reused).  Nothing
    is invalidated from here (docs/fuse-notes.md): the kernel learns of a removal by
    ENOENT on its next lookup, within the entry timeout.
    """

    def __init__(self, tree: Tree) -> None:
        super().__init__(tree, "", None)
        self._subsystems: dict[str, SubsystemDir] = {}

    def mode(self) -> int:
        return stat.S_IFDIR | (0o775 if self.tree.group_writable else 0o755)

    def children(self) -> dict[str, Node]:
        runtimes = self.tree.exchange.runtimes
        for name in [n for n, d in self._subsystems.items() if runtimes.get(n) is not d.runtime]:
            self._subsystems.pop(name)
        out: dict[str, Node] = dict(self.fixed)
        for name, runtime in runtimes.items():
            node = self._subsystems.get(name)
            if node is None:
                node = self._subsystems[name] = SubsystemDir(self.tree, self, runtime)
            out[name] = node
        return out


def _json(obj: object) -> str:
    return json.dumps(obj, indent=2, sort_keys=False) + "\n"


class Tree:
    """The inode table and the root of the mount."""

    def __init__(self, control: Control, version_text: str, metrics: ReadFn,
                 group_writable: bool, backends_text: str = "") -> None:
        exchange = control.exchange
        #: what the tree shows (read only) and where every write goes
        self.exchange = exchange
        self.control = control
        self.group_writable = group_writable
        self.started_ns = int(exchange.started * 1e9)
        self.inodes: dict[int, Node] = {}
        self._next_ino = itertools.count(1)  # 1 is pyfuse3.ROOT_INODE
        self.root = RootDir(self)
        self.root.add(Attr(self, "version", self.root, read=lambda: version_text))
        self.root.add(EventsFile(self, "events", self.root, None))
        self.root.add(Attr(self, "metrics", self.root, read=metrics))
        # computed once by the daemon before the mount (listing imports every backend)
        self.root.add(Attr(self, "backends", self.root, read=lambda: backends_text))
        # the operator's switches (docs/ABI.md, the root): write-only 0200 (0220 with a group)
        self.root.add(Attr(self, "control", self.root, write=control.root_control,
                           caller=True))
        self.root.add(Attr(self, "errors", self.root, read=exchange.root_errors_text))
        host_text = host_id(exchange.state_dir, exchange.config.mount.host_id) + "\n"
        self.root.add(Attr(self, "host", self.root, read=lambda: host_text))
        self.root.children()  # the configured subsystems get the first inodes

    def register(self, node: Node) -> int:
        ino = next(self._next_ino)
        self.inodes[ino] = node
        return ino

    def get(self, ino: int) -> Node | None:
        node = self.inodes.get(ino)
        if node is None or not node.alive():
            return None
        return node

    def forget(self, ino: int) -> None:
        node = self.inodes.get(ino)
        if node is not None and not node.alive():
            del self.inodes[ino]
