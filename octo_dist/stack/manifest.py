"""The pinned stack, read from env/stack.toml.

Every consumer of a version (lock generation, `make env`, the image install script, `check-env`)
goes through this module, so no pin is ever duplicated in code. The file is found next to the
package in a checkout (``<repo>/env/stack.toml``), at ``$OCTO_DIST_MANIFEST`` when set (the images
copy it to ``/opt/octo-dist/env/stack.toml`` and set that variable), or passed explicitly.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional

from octo_dist.stack import toml_subset
from octo_dist.problems import Refusal

try:  # Python 3.11+
    import tomllib as _toml  # novermin (guarded: 3.11+ only)
except ImportError:  # 3.10 in the images has tomli (in every lock); ABCI's system 3.9 has neither
    try:
        import tomli as _toml
    except ImportError:
        _toml = None

MANIFEST_ENV = "OCTO_DIST_MANIFEST"
MANIFEST_LIMIT = 1 << 20  # bytes; env/stack.toml is about 10 KiB
PROFILE_ENV = "OCTO_DIST_PROFILE"
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MANIFEST = REPO_ROOT / "env" / "stack.toml"
LOCK_DIR_NAME = "locks"


class ManifestError(Refusal, ValueError):
    """The manifest is missing, malformed, or asked for a profile it does not define."""


def canonical_name(name: str) -> str:
    """PEP 503 normalisation: ``"Tensorflow_Datasets"`` -> ``"tensorflow-datasets"``."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclasses.dataclass(frozen=True)
class Override:
    """A requirement of another package that the lock deliberately breaks."""

    package: str
    version: str
    required_by: str
    required_spec: str
    reason: str


@dataclasses.dataclass(frozen=True)
class DirectWheel:
    """A distribution that is not on PyPI, pinned by exact version and URL."""

    name: str
    version: str
    url: str
    find_links: str = ""

    @property
    def public_version(self) -> str:
        """``"0.4.20+cuda11.cudnn86"`` -> ``"0.4.20"``: what the PyPI-only lock resolves against."""
        return self.version.split("+", 1)[0]


@dataclasses.dataclass(frozen=True)
class GitDep:
    """A git-only distribution pinned to a full commit SHA."""

    name: str
    url: str
    commit: str
    distribution: str

    @property
    def pip_spec(self) -> str:
        return f"{self.distribution} @ git+{self.url}@{self.commit}"


@dataclasses.dataclass(frozen=True)
class BaseImage:
    """A container base image pinned by tag (for people) and digest (what engines pull)."""

    name: str  # the profiles' `image_base`: "cuda11"
    repository: str  # "docker.io/nvidia/cuda"
    tag: str  # "11.8.0-base-ubuntu22.04"
    digest: str  # "sha256:79e5b2cf…" (64 hex)

    @property
    def tagged(self) -> str:
        """``docker.io/nvidia/cuda:11.8.0-base-ubuntu22.04``: the OCI ``base.name`` label."""
        return f"{self.repository}:{self.tag}"

    @property
    def pinned(self) -> str:
        """``docker.io/nvidia/cuda@sha256:…``: what FROM pulls (no engine but Docker takes tag and digest at once)."""
        return f"{self.repository}@{self.digest}"


@dataclasses.dataclass(frozen=True)
class Profile:
    """One installable stack: the common requirements plus the profile's own."""

    name: str
    description: str
    python: str
    platform: str
    lock_pythons: tuple[str, ...]
    gpu: bool
    requirements: Mapping[str, str]
    overrides: tuple[Override, ...]
    direct: tuple[DirectWheel, ...]
    by_python: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)
    image_base: str = (
        ""  # key into [images]: the base image of this profile's container target, if any
    )
    # "8.9": the cuDNN (major.minor) a CUDA plugin was built against, where jaxlib is PyPI's CPU wheel and its
    # version carries no "+cuda12.cudnn89" tag to say it; "" where jaxlib's tag says it (cuda11) or no CUDA.
    cudnn_build: str = ""

    def requirements_for(self, python: str) -> dict[str, str]:
        """Requirements for one ``major.minor`` Python: the profile's plus that Python's own."""
        reqs = dict(self.requirements)
        reqs.update(self.by_python.get(python, {}))
        return reqs

    def exact_pins(self, python: Optional[str] = None) -> dict[str, str]:
        """Canonical name -> version for every ``==`` requirement, direct wheels included."""
        reqs = self.requirements_for(python or self.python)
        pins = {
            name: spec[2:]
            for name, spec in reqs.items()
            if spec.startswith("==") and "," not in spec
        }
        for override in self.overrides:
            pins[canonical_name(override.package)] = override.version
        for wheel in self.direct:
            pins[canonical_name(wheel.name)] = wheel.version
        return pins


@dataclasses.dataclass(frozen=True)
class Manifest:
    path: Path
    profiles: Mapping[str, Profile]
    git: tuple[GitDep, ...]
    dev_requirements: Mapping[str, str]
    lock_exclude_newer: str = (
        ""  # `make lock` ignores uploads after this instant: "2026-12-01T00:00:00Z"
    )
    images: Mapping[str, BaseImage] = dataclasses.field(default_factory=dict)

    @property
    def env_dir(self) -> Path:
        return self.path.parent

    @property
    def lock_dir(self) -> Path:
        return self.env_dir / LOCK_DIR_NAME

    def profile(self, name: str) -> Profile:
        try:
            return self.profiles[name]
        except KeyError:
            known = ", ".join(sorted(self.profiles))
            raise ManifestError(
                f"unknown profile {name!r} in {self.path}; expected one of: {known} "
                f"(e.g. `octo-dist check-env --profile cpu`)"
            ) from None

    def lock_path(self, profile: str, python: str, group: str = "") -> Path:
        """``env/locks/cpu-py3.11.txt``; ``group="dev"`` gives ``cpu-py3.11-dev.txt``."""
        suffix = f"-{group}" if group else ""
        return self.lock_dir / f"{profile}-py{python}{suffix}.txt"


_MISSING = object()
_KINDS: Dict[type, str] = {
    str: "a string",
    bool: "true or false",
    int: "an integer",
    dict: "a table",
    list: "an array",
}


class _Fields:
    """Typed reads from one TOML table, naming the file and the key in every refusal.

    ``tomllib`` gives whatever the file says: ``gpu = "false"`` is a non-empty string (true to ``bool()``) and
    ``lock_pythons = "3.11"`` iterates as ``"3", ".", "1", "1"``. Each read here insists on the TOML type.
    """

    def __init__(self, table: Any, where: str, path: Path):
        self.path, self.where = path, where
        if not isinstance(table, dict):
            raise ManifestError(
                f"{path}: {where or 'the document'} must be {_KINDS[dict]}"
                f"{f' ([{where}])' if where else ''}, found {_shown(table)}"
            )
        self.table = table

    def key(self, key: str) -> str:
        return f"{self.where}.{_quoted(key)}" if self.where else _quoted(key)

    def get(self, key: str, kind: type, default: Any = _MISSING) -> Any:
        value = self.table.get(key, _MISSING)
        if value is _MISSING:
            if default is _MISSING:
                raise ManifestError(
                    f"{self.path}: {self.key(key)} is missing; expected {_KINDS[kind]}"
                )
            return default
        # bool is an int in Python; TOML keeps them apart.
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ManifestError(
                f"{self.path}: {self.key(key)} must be {_KINDS[kind]}, found {_shown(value)}"
                + (
                    f" (write {key} = {str(value).lower()})"
                    if kind is bool and str(value).lower() in ("true", "false")
                    else ""
                )
            )
        return value

    def strings(self, key: str, default: Any = _MISSING) -> Optional[tuple]:
        value = self.get(key, list, default)
        if value is None:
            return None
        bad = [v for v in value if not isinstance(v, str)]
        if bad:
            raise ManifestError(
                f"{self.path}: {self.key(key)} must be an array of strings, found {_shown(bad[0])} in it"
            )
        return tuple(value)

    def sub(self, key: str) -> "_Fields":
        return _Fields(self.get(key, dict, {}), self.key(key), self.path)

    def tables(self) -> Dict[str, "_Fields"]:
        """Every value of this table, each of which must itself be a table."""
        return {
            name: _Fields(self.get(name, dict), self.key(name), self.path) for name in self.table
        }


def _quoted(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else f'"{key}"'


def _shown(value: Any) -> str:
    kind = {
        str: "string",
        bool: "boolean",
        int: "integer",
        float: "float",
        dict: "table",
        list: "array",
    }
    return f"{value!r} ({kind.get(type(value), type(value).__name__)})"


def _requirements(fields: _Fields) -> dict[str, str]:
    out = {}
    for name, spec in fields.table.items():
        if not isinstance(spec, str):
            raise ManifestError(
                f"{fields.path}: {fields.key(name)} must be a version string like '==1.2.3', "
                f"found {_shown(spec)}"
            )
        out[canonical_name(name)] = spec.replace(" ", "")
    return out


def _profile(
    name: str,
    raw: _Fields,
    common: Mapping[str, str],
    common_by_python: Mapping[str, Mapping[str, str]],
) -> Profile:
    # `inherit = ["numpy", ...]` takes only those common requirements (a slim test profile).
    inherit = raw.strings("inherit", None)
    keep = None if inherit is None else {canonical_name(n) for n in inherit}
    reqs = {n: s for n, s in common.items() if keep is None or n in keep}
    reqs.update(_requirements(raw.sub("requirements")))
    overrides = []
    for i, o in enumerate(raw.get("overrides", list, [])):
        o = _Fields(o, f"{raw.key('overrides')}[{i}]", raw.path)
        overrides.append(
            Override(
                package=canonical_name(o.get("package", str)),
                version=o.get("version", str),
                required_by=canonical_name(o.get("required_by", str)),
                required_spec=o.get("required_spec", str),
                reason=o.get("reason", str),
            )
        )
    direct = tuple(
        DirectWheel(
            name=canonical_name(n),
            version=d.get("version", str),
            url=d.get("url", str),
            find_links=d.get("find_links", str, ""),
        )
        for n, d in raw.sub("direct").tables().items()
    )
    python = raw.get("python", str)
    lock_pythons = raw.strings("lock_pythons", [python])
    if not lock_pythons:
        raise ManifestError(
            f"{raw.path}: {raw.key('lock_pythons')} is empty; expected at least one Python, "
            f'e.g. lock_pythons = ["{python}"]'
        )
    return Profile(
        name=name,
        description=raw.get("description", str, ""),
        python=python,
        platform=raw.get("platform", str),
        lock_pythons=lock_pythons,
        gpu=raw.get("gpu", bool, False),
        requirements=reqs,
        overrides=tuple(overrides),
        direct=direct,
        by_python={
            py: {n: s for n, s in t.items() if keep is None or n in keep}
            for py, t in common_by_python.items()
        },
        image_base=raw.get("image_base", str, ""),
        cudnn_build=_cudnn_build(raw),
    )


def _cudnn_build(raw: _Fields) -> str:
    value = raw.get("cudnn_build", str, "")
    if value and not re.fullmatch(r"\d+\.\d+", value):
        raise ManifestError(
            f'{raw.path}: {raw.key("cudnn_build")} must be a cuDNN major.minor like "8.9", found {value!r}'
        )
    return value


def parse_manifest(data: Mapping[str, object], path: Path) -> Manifest:
    """Build a :class:`Manifest` from the decoded TOML (pure; tests pass dicts).

    Raises:
        ManifestError: a key missing or of the wrong TOML type (file and key named), or a pin that is not one.
    """
    top = _Fields(dict(data), "", path)
    if data.get("schema") != 1:
        raise ManifestError(f"{path}: expected `schema = 1`, found {data.get('schema')!r}")
    common_fields = top.sub("common")
    common = _requirements(common_fields.sub("requirements"))
    common_by_python = {
        py: _requirements(t.sub("requirements"))
        for py, t in common_fields.sub("by_python").tables().items()
    }
    profiles = {
        name: _profile(name, raw, common, common_by_python)
        for name, raw in top.sub("profiles").tables().items()
    }
    git = []
    for name, raw in top.sub("git").tables().items():
        commit = raw.get("commit", str, "")
        if not re.fullmatch(r"[0-9a-f]{40}", commit):
            raise ManifestError(
                f"{path}: git.{name}.commit must be a full 40-hex commit SHA, found {commit!r}; "
                f"a branch or tag is not a pin"
            )
        git.append(
            GitDep(
                name=name,
                url=raw.get("url", str),
                commit=commit,
                distribution=raw.get("distribution", str, name),
            )
        )
    dev = _requirements(top.sub("dev").sub("requirements"))
    images = {
        name: _base_image(name, raw, path) for name, raw in top.sub("images").tables().items()
    }
    for profile in profiles.values():
        if profile.image_base and profile.image_base not in images:
            raise ManifestError(
                f"{path}: profiles.{profile.name}.image_base = {profile.image_base!r}, but there is no "
                f"[images.{profile.image_base}]; expected one of: {', '.join(sorted(images)) or '(none)'}"
            )
    return Manifest(
        path=path,
        profiles=profiles,
        git=tuple(git),
        dev_requirements=dev,
        lock_exclude_newer=top.sub("project").get("lock_exclude_newer", str, ""),
        images=images,
    )


def _base_image(name: str, fields: _Fields, path: Path) -> BaseImage:
    missing = [k for k in ("repository", "tag", "digest") if not fields.table.get(k)]
    if missing:
        raise ManifestError(
            f"{path}: [images.{name}] lacks {', '.join(missing)}; expected repository, tag and digest"
        )
    raw = {k: fields.get(k, str) for k in ("repository", "tag", "digest")}
    # A tag alone is not a pin: it is re-pushed (nvidia/cuda tags are rebuilt for OS security updates).
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", raw["digest"]):
        raise ManifestError(
            f"{path}: images.{name}.digest must be 'sha256:' and 64 hex, found {raw['digest']!r}; "
            f"`make refresh-digests` writes it where a registry is reachable"
        )
    # "localhost:5000/base" is a registry port, "ubuntu:22.04" a tag in the wrong field.
    if "@" in raw["repository"] or ":" in raw["repository"].rsplit("/", 1)[-1]:
        raise ManifestError(
            f"{path}: images.{name}.repository must hold no tag or digest, found {raw['repository']!r}"
        )
    return BaseImage(name=name, repository=raw["repository"], tag=raw["tag"], digest=raw["digest"])


def manifest_path(environ: Mapping[str, str] = os.environ, explicit: Optional[str] = None) -> Path:
    if explicit:
        return Path(explicit)
    if environ.get(MANIFEST_ENV):
        return Path(environ[MANIFEST_ENV])
    return DEFAULT_MANIFEST


def load_manifest(
    path: Optional[os.PathLike] = None, environ: Mapping[str, str] = os.environ
) -> Manifest:
    """Read the manifest from ``path``, ``$OCTO_DIST_MANIFEST`` or the checkout's env/."""
    p = Path(path) if path else manifest_path(environ)
    fix = f"pass --manifest /path/to/env/stack.toml, or set {MANIFEST_ENV}=/path/to/env/stack.toml"
    try:
        # A FIFO would block the open, a device never end: only a regular file is opened.
        mode = os.stat(p).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(21, "Is a directory")
        if not stat.S_ISREG(mode):
            raise ManifestError(
                f"manifest {p} is not a regular file (a FIFO, device or socket); expected the file env/stack.toml "
                f"of an octo-dist checkout. Fix: {fix}"
            )
        # Bounded: the manifest is a few KiB; a path to a disk image must not be read whole.
        with open(p, "rb") as f:
            raw = f.read(MANIFEST_LIMIT + 1)
    except FileNotFoundError:
        raise ManifestError(
            f"no manifest at {p}; expected env/stack.toml of an octo-dist checkout. Fix: {fix}"
        ) from None
    except OSError as e:  # IsADirectoryError (OCTO_DIST_MANIFEST=env/), PermissionError
        what = (
            "a directory" if isinstance(e, IsADirectoryError) else f"unreadable ({e.strerror or e})"
        )
        raise ManifestError(
            f"manifest {p} is {what}; expected the file env/stack.toml of an octo-dist checkout. Fix: {fix}"
        ) from None
    if len(raw) > MANIFEST_LIMIT:
        raise ManifestError(
            f"manifest {p} is longer than {MANIFEST_LIMIT} bytes; expected env/stack.toml (a few KiB). Fix: {fix}"
        )
    try:
        data = loads(raw.decode())
    except (
        ValueError,
        UnicodeDecodeError,
    ) as e:  # TOMLDecodeError and TomlSubsetError are ValueErrors; loads makes a RecursionError one
        raise ManifestError(
            f"{p} is not valid TOML ({str(e).splitlines()[0] if str(e) else type(e).__name__}); expected "
            f"env/stack.toml of an octo-dist checkout. Fix: {fix}"
        ) from None
    return parse_manifest(data, p)


def loads(text: str, reader: Optional[Callable[[str], Dict[str, Any]]] = None) -> Dict[str, Any]:
    """Decode the manifest's TOML: ``tomllib`` (3.11+) or ``tomli`` where present, else the subset reader.

    The subset reader is what ABCI's system Python 3.9 uses for ``make sif``/``make docker``; a test keeps it
    equal to ``tomllib`` on the committed manifest.
    """
    if reader is None:
        reader = _toml.loads if _toml is not None else toml_subset.loads
    try:
        return reader(text)
    except RecursionError:  # tomllib recurses once per "[" of nested arrays: "a = [[[[...]]]]"
        raise ValueError("arrays nested too deeply") from None


def default_profile(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """The profile named by ``$OCTO_DIST_PROFILE`` (set in the images), else None."""
    return environ.get(PROFILE_ENV) or None
