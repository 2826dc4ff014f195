"""ops.llamacpp without building or downloading: the sdist check, build keys and command lines, GGUF parameters,
converter and llama-quantize command lines, the pre-tokenizer fallback wrapper and the GGUF manifest."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from ops.llamacpp import build, gguf, hf_to_gguf, source
from service.runtime import manifest as mf

CPU_A = {"cpu": "AMD EPYC", "isa": ["avx2", "fma", "avx512f"], "cpus": 2}
CPU_B = {"cpu": "AMD EPYC", "isa": ["avx2", "fma"], "cpus": 2}


# --- source -----------------------------------------------------------------------------------------------------

def test_download_command_fetches_the_sdist_alone_with_pip():
    cmd = source.download_command("0.3.36", Path("/c/src"))
    assert cmd[:3] == [sys.executable, "-m", "pip"]
    assert cmd[3] == "download"
    assert cmd[cmd.index("--no-binary") + 1] == ":all:"  # a wheel has no llama.cpp sources
    assert "--no-deps" in cmd
    assert "llama-cpp-python==0.3.36" in cmd and cmd[-2:] == ["-d", "/c/src"]


def test_the_sdist_is_checked_against_its_pinned_sha256(tmp_path, monkeypatch):
    sdist = tmp_path / "llama_cpp_python-9.9.9.tar.gz"
    sdist.write_bytes(b"not the release")
    monkeypatch.setitem(source.SDIST_SHA256, "9.9.9", source.sha256_of(sdist))
    assert source.check_sdist(sdist, "9.9.9") == source.SDIST_SHA256["9.9.9"]
    monkeypatch.setitem(source.SDIST_SHA256, "9.9.9", "0" * 64)
    with pytest.raises(source.SourceError, match=f"has sha256 {source.sha256_of(sdist)}, the pinned one is 0000"):
        source.check_sdist(sdist, "9.9.9")
    with pytest.raises(source.SourceError, match=r"no sha256 is pinned for llama-cpp-python 1\.0\.0; add it"):
        source.check_sdist(sdist, "1.0.0")


def test_the_pinned_version_has_a_pinned_hash():
    assert len(source.SDIST_SHA256[source.VERSION]) == 64


def test_missing_parts_of_the_tree_are_named(tmp_path):
    (tmp_path / "CMakeLists.txt").write_text("")
    (tmp_path / "tools" / "server").mkdir(parents=True)
    missing = source.missing_parts(tmp_path)
    assert "CMakeLists.txt" not in missing and "tools/server" not in missing
    assert "convert_hf_to_gguf.py" in missing and "gguf-py/gguf/__init__.py" in missing


def _patch_dir(tmp_path, monkeypatch, text: str) -> Path:
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "0001-fix.patch").write_text(text)
    monkeypatch.setattr(source, "PATCHES", patches)
    return patches


FIX = "--- a/f.c\n+++ b/f.c\n@@ -1 +1 @@\n-int x = 1;\n+int x = 2;\n"


def test_the_patches_are_applied_to_the_tree_and_their_hash_names_it(tmp_path, monkeypatch):
    patches = _patch_dir(tmp_path, monkeypatch, FIX)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "f.c").write_text("int x = 1;\n")
    key = source.patches_key()
    source._apply_patches(tree, tmp_path / "partial")
    assert (tree / "f.c").read_text() == "int x = 2;\n"
    (patches / "0001-fix.patch").write_text(FIX.replace("x = 2", "x = 3"))
    assert source.patches_key() != key  # another patch: another tree and other builds


def test_a_patch_that_does_not_apply_names_itself_and_the_fix(tmp_path, monkeypatch):
    _patch_dir(tmp_path, monkeypatch, FIX)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "f.c").write_text("int y = 0;\n")
    with pytest.raises(source.SourceError, match=r"0001-fix\.patch does not apply.*rebased or removed"):
        source._apply_patches(tree, tmp_path / "partial")


def test_the_shipped_patches_are_unified_diffs_of_the_llama_cpp_tree():
    assert source.patches(), "ops/llamacpp/patches holds the flash-attention accumulator fix"
    for path in source.patches():
        text = path.read_text()
        assert text.startswith("--- a/") and "\n+++ b/" in text and "\n@@ " in text, path.name


# --- build ------------------------------------------------------------------------------------------------------

def test_native_and_portable_flags():
    native, portable = build.BuildConfig(cpu=CPU_A), build.BuildConfig(native=False)
    assert "-DGGML_NATIVE=ON" in native.flags() and "-DGGML_NATIVE=OFF" in portable.flags()
    assert {"-DGGML_BACKEND_DL=ON", "-DGGML_CPU_ALL_VARIANTS=ON"} <= set(portable.flags())
    for config in (native, portable):  # nothing downloaded at build or run time
        assert {"-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF"} <= set(config.flags())


def test_cache_key_follows_version_flags_targets_and_the_native_cpu():
    base = build.BuildConfig(cpu=CPU_A)
    assert base.dirname() == f"{source.VERSION}-{base.key()}" and len(base.key()) == 12
    assert build.BuildConfig(cpu=dict(CPU_A)).key() == base.key()
    assert build.BuildConfig(cpu=CPU_B).key() != base.key()  # another ISA: a native build is not reused
    assert build.BuildConfig(version="0.3.35", cpu=CPU_A).key() != base.key()
    assert build.BuildConfig(targets=("llama-server",), cpu=CPU_A).key() != base.key()
    assert build.BuildConfig(native=False).key() != base.key()
    assert base.key_material()["patches"] == source.patches_key()  # a changed patch builds again
    # A portable build runs on any CPU: where it was built does not change its key.
    assert build.BuildConfig(native=False, cpu=CPU_A).key() == build.BuildConfig(native=False, cpu=CPU_B).key()


# A Sapphire Rapids Xeon's flags, as /proc/cpuinfo lists them (the ones ggml's options read, and AMX).
AMX_FLAGS = ["sse4_2", "avx", "f16c", "fma", "bmi2", "avx2", "avx_vnni", "avx512f", "avx512cd", "avx512vl", "avx512dq",
             "avx512bw", "avx512vbmi", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16"]
CPU_AMX = {"cpu": "Intel(R) Xeon(R) Processor", "isa": ["avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw",
                                                        "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
                                                        "amx_int8", "amx_bf16"], "cpus": 2, "flags": AMX_FLAGS}


def test_a_native_build_for_an_amx_cpu_names_its_isa_and_leaves_amx_out():
    """-march=native would compile ggml's AMX kernels, which die with SIGSEGV on the 2b model (issue 30): the CPU's
    own ISA options instead, AMX off; the repacked kernels (CPU_REPACK, on by default) stay."""
    flags = build.BuildConfig(cpu=CPU_AMX).flags()
    assert "-DGGML_NATIVE=OFF" in flags and "-DGGML_NATIVE=ON" not in flags
    for option in ("AVX2", "FMA", "F16C", "BMI2", "AVX_VNNI", "AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16"):
        assert f"-DGGML_{option}=ON" in flags, option
    assert {"-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"} <= set(flags)
    assert not any("REPACK" in f for f in flags) and "-DGGML_BACKEND_DL=ON" not in flags
    # Each option only where the CPU has every flag its compiler flags need (AVX512: f, cd, vl, dq and bw).
    no_vl = build.native_flags([f for f in AMX_FLAGS if f not in ("avx512vl", "avx512vbmi")])
    assert "-DGGML_AVX512=OFF" in no_vl and "-DGGML_AVX512_VBMI=OFF" in no_vl and "-DGGML_AVX2=ON" in no_vl
    # A CPU without AMX keeps -march=native, and the key of its earlier builds.
    assert build.native_flags(["avx2", "fma", "avx512f"]) == ("-DGGML_NATIVE=ON",)
    assert build.BuildConfig(cpu=CPU_A).key() == build.BuildConfig(cpu={**CPU_A, "flags": ["avx2", "fma"]}).key()


def test_the_amx_cpus_build_key_is_not_the_crashing_builds():
    amx = build.BuildConfig(cpu=CPU_AMX)
    crashing = {**amx.key_material(), "flags": [*build.COMMON_FLAGS, "-DGGML_NATIVE=ON"]}
    assert amx.key_material()["flags"] != crashing["flags"] and amx.key_material()["cpu"] == crashing["cpu"]
    assert amx.key() != build.BuildConfig(cpu={**CPU_AMX, "flags": AMX_FLAGS[:-4]}).key()  # no VBMI/AMX: other flags
    # The portable build's key moves too: its AMX variant is removed (EXCLUDED_FEATURES), unlike before.
    assert build.BuildConfig(native=False).key_material()["excluded_cpu_features"] == list(build.EXCLUDED_FEATURES)
    assert "excluded_cpu_features" not in amx.key_material()


def test_default_config_reads_every_cpu_flag(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 amx_int8 avx2\n\nprocessor\t: 1\nflags\t\t: other\n")
    assert build.cpu_flags(cpuinfo) == ["amx_int8", "avx2", "fpu"]
    assert "flags" in build.default_config().cpu and build.default_config(native=False).cpu == {}


GGML_CMAKE = """
function(ggml_add_cpu_backend_variant tag_name)
    ggml_add_cpu_backend_variant_impl(${tag_name})
endfunction()
    if (GGML_SYSTEM_ARCH STREQUAL "x86")
        ggml_add_cpu_backend_variant(x64)
        ggml_add_cpu_backend_variant(zen4  SSE42 AVX F16C FMA AVX2 BMI2 AVX512 AVX512_VBMI AVX512_VNNI AVX512_BF16)
        if (NOT MSVC)
            # MSVC doesn't support AMX
            ggml_add_cpu_backend_variant(sapphirerapids SSE42 AVX F16C FMA AVX2 BMI2 AVX512 AVX512_VBMI
                                                        AVX512_VNNI AVX512_BF16 AMX_TILE AMX_INT8)
        endif()
        ggml_add_cpu_backend_variant(armv8.2_1    DOTPROD)
"""


def test_a_portable_build_loses_its_amx_variant(tmp_path):
    variants = build.cpu_variants(GGML_CMAKE)
    assert set(variants) == {"x64", "zen4", "sapphirerapids", "armv8.2_1"} and variants["x64"] == ()
    assert build.excluded_variants(GGML_CMAKE, build.EXCLUDED_FEATURES) == ["sapphirerapids"]
    tree, bin_dir = tmp_path / "llama.cpp", tmp_path / "bin"
    (tree / "ggml" / "src").mkdir(parents=True)
    (tree / "ggml" / "src" / "CMakeLists.txt").write_text(GGML_CMAKE)
    bin_dir.mkdir()
    for name in ("libggml-cpu-zen4.so", "libggml-cpu-sapphirerapids.so", "libggml-cpu-x64.so", "llama-server"):
        (bin_dir / name).write_text("")
    assert build.remove_variants(tree, bin_dir, build.EXCLUDED_FEATURES) == ["sapphirerapids"]
    assert sorted(p.name for p in bin_dir.iterdir()) == ["libggml-cpu-x64.so", "libggml-cpu-zen4.so", "llama-server"]
    assert build.remove_variants(tree, bin_dir, ()) == []  # a native build: nothing to remove
    (tree / "ggml" / "src" / "CMakeLists.txt").write_text("# a layout this code does not know\n")
    with pytest.raises(build.BuildError, match="cannot tell which CPU variants use AMX_TILE"):
        build.remove_variants(tree, bin_dir, build.EXCLUDED_FEATURES)


def test_configure_and_build_commands():
    config = build.BuildConfig(cpu=CPU_A)
    assert build.configure_command(Path("/s"), Path("/b"), config) == ["cmake", "-S", "/s", "-B", "/b",
                                                                       *config.flags()]
    cmd = build.build_command(Path("/b"), config, 2)
    assert cmd[:3] == ["cmake", "--build", "/b"] and cmd[cmd.index("-j") + 1] == "2"
    assert cmd[cmd.index("--target") + 1:] == ["llama-server", "llama-quantize", "llama-mtmd-cli"]
    assert build.niced(["make"], 19) == ["nice", "-n", "19", "make"]
    assert build.niced(["make"], 0) == ["make"]


def test_a_build_without_build_json_is_not_found(tmp_path, monkeypatch):
    monkeypatch.setenv("VLFLEET_CACHE", str(tmp_path))
    config = build.BuildConfig(cpu=CPU_A)
    bin_dir = build.build_dir(config) / "build" / "bin"
    bin_dir.mkdir(parents=True)
    for name in config.targets:
        (bin_dir / name).write_text("")
    assert build.find(config) is None  # interrupted: binaries but no build.json
    (build.build_dir(config) / "build.json").write_text(json.dumps({"version": config.version}))
    found = build.find(config)
    assert found is not None and found.binary("llama-server") == bin_dir / "llama-server"
    (bin_dir / "llama-quantize").unlink()
    assert build.find(config) is None


def test_a_failing_step_names_itself_and_shows_the_log_tail(tmp_path):
    log = tmp_path / "build.log"
    with open(log, "w") as out, pytest.raises(build.BuildError, match=r"cmake --build failed \(exit 3\)") as e:
        build._run([sys.executable, "-c", "print('[ 50%] compiling x'); print('error: boom'); raise SystemExit(3)",
                    "--build"], out, deadline=float("inf"), say=lambda m: None, log=log)
    assert "error: boom" in str(e.value)


def test_a_step_past_its_deadline_is_stopped(tmp_path):
    log = tmp_path / "build.log"
    said: list[str] = []
    with open(log, "w") as out, pytest.raises(build.BuildError, match="did not finish in time"):
        build._run([sys.executable, "-c", "import time; print('[  5%] a', flush=True); time.sleep(60)"], out,
                   deadline=0.0, say=said.append, log=log)
    assert said == ["[  5%] a"]


# --- GGUF parameters and commands --------------------------------------------------------------------------------

def test_gguf_params_normalise_and_choose_the_tool():
    p = gguf.GgufParams("q4_0", "Q8_0")
    assert (p.quant, p.mmproj_type) == ("Q4_0", "q8_0")
    assert p.needs_quantize and p.lm_outtype == "f16"  # llama-quantize reads the f16 file
    assert (p.lm_file, p.mmproj_file) == ("language-model-Q4_0.gguf", "mmproj-q8_0.gguf")
    direct = gguf.GgufParams("q8_0", "f16")
    assert not direct.needs_quantize and direct.lm_outtype == "q8_0"
    assert direct.label() == "Q8_0-mmproj-f16"
    assert p.describe() == {"format": "gguf", "language_model": "Q4_0", "mmproj": "q8_0",
                            "files": {"language_model": "language-model-Q4_0.gguf", "mmproj": "mmproj-q8_0.gguf"}}


def test_an_output_type_names_the_file_and_goes_to_llama_quantize():
    p = gguf.GgufParams("Q4_0", "q8_0", "q4_k")
    assert p.output_type == "Q4_K" and p.lm_file == "language-model-Q4_0-output-Q4_K.gguf"
    assert p.label() == "Q4_0-output-Q4_K-mmproj-q8_0"
    assert p.describe()["output"] == "Q4_K" and "output" not in gguf.GgufParams("Q4_0").describe()
    assert gguf.quantize_command(Path("/b/q"), Path("f16.gguf"), Path("q.gguf"), "Q4_0", 2, p.output_type) == [
        "/b/q", "--output-tensor-type", "Q4_K", "f16.gguf", "q.gguf", "Q4_0", "2"]


@pytest.mark.parametrize(("quant", "mmproj", "output", "message"), [
    ("Q9", "q8_0", None, "quantisation 'Q9' is not one of Q4_0, "),
    ("Q4_0", "Q4_0", None, "mmproj type 'Q4_0' is not one of f32, f16, bf16, q8_0"),
    ("Q4_0", "q8_0", "Q3", "output tensor type 'Q3' is not one of Q4_0, Q4_K, "),
    ("F16", "q8_0", "Q4_K", "set by llama-quantize, which F16 does not go through: choose one of Q4_0, "),
])
def test_gguf_params_refuse_unknown_types(quant, mmproj, output, message):
    with pytest.raises(ValueError, match=message):
        gguf.GgufParams(quant, mmproj, output)


def test_converter_and_quantize_commands():
    cmd = gguf.converter_command(Path("/t"), Path("/ckpt"), Path("/o/mm.gguf"), "q8_0", mmproj=True, fallback="qwen2")
    assert cmd[:3] == [sys.executable, str(gguf.WRAPPER), "/t"]
    assert cmd[3:cmd.index("--")] == ["--pre-tokenizer-fallback", "qwen2"]
    assert cmd[cmd.index("--") + 1:] == ["/ckpt", "--outtype", "q8_0", "--outfile", "/o/mm.gguf", "--mmproj"]
    plain = gguf.converter_command(Path("/t"), Path("/ckpt"), Path("/o/lm.gguf"), "f16")
    assert "--pre-tokenizer-fallback" not in plain and "--mmproj" not in plain
    assert gguf.quantize_command(Path("/b/llama-quantize"), Path("f16.gguf"), Path("q.gguf"), "Q4_0", 2) == [
        "/b/llama-quantize", "f16.gguf", "q.gguf", "Q4_0", "2"]


def test_the_fallback_is_only_for_qwen_checkpoints(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_vl",
                                                      "architectures": ["Qwen3VLForConditionalGeneration"]}))
    assert gguf.pre_tokenizer_fallback(tmp_path) == "qwen2"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    assert gguf.pre_tokenizer_fallback(tmp_path) is None


def test_a_quantisation_that_needs_llama_quantize_is_refused_without_it(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(gguf.GgufError, match=r"Q4_0 is made by llama-quantize, which is not built: run `vlfleet "
                                             r"llamacpp.build` first, or choose --quant F32 or F16 or BF16 or Q8_0"):
        gguf.convert(tmp_path, tmp_path / "out", gguf.GgufParams("Q4_0"), quantize=None)
    assert not (tmp_path / "out").exists()


def test_gguf_manifest_is_the_service_format_and_verifies(tmp_path):
    art = tmp_path / "art"
    art.mkdir()
    params = gguf.GgufParams("Q4_0", "q8_0")
    (art / params.lm_file).write_bytes(b"GGUF" + bytes(100))
    (art / params.mmproj_file).write_bytes(b"GGUF" + bytes(50))
    tools = {"python": "3.11.7", "llama-cpp-python": "0.3.36"}
    manifest = gguf.gguf_manifest(art, origin={"kind": "dir", "uri": "/c", "revision": "sha256:0"}, params=params,
                                  tools=tools, pre_tokenizer="qwen2")
    mf.write_manifest(art, manifest)
    assert manifest["weight_format"]["language_model"] == "Q4_0"
    assert manifest["min_runtime"] == {"openvino": "0", "llama-cpp-python": "0.3.36"}
    assert manifest["gguf"] == {"pre_tokenizer_fallback": "qwen2"}
    assert sorted(manifest["files"]) == ["language-model-Q4_0.gguf", "mmproj-q8_0.gguf"]
    assert manifest["files"]["mmproj-q8_0.gguf"] == {"size": 54, "sha256": mf.sha256_file(art / "mmproj-q8_0.gguf")}
    assert mf.verify(art, full=True).ok
    (art / params.mmproj_file).write_bytes(b"GGUF" + bytes(49) + b"x")
    assert mf.verify(art, full=True).modified == {"mmproj-q8_0.gguf": "sha256 differs from the manifest"}


# --- the converter wrapper --------------------------------------------------------------------------------------

def test_wrapper_arguments():
    assert hf_to_gguf.split_args(["/t", "--pre-tokenizer-fallback", "qwen2", "--", "/c", "--mmproj"]) == (
        Path("/t"), "qwen2", ["/c", "--mmproj"])
    assert hf_to_gguf.split_args(["/t", "--", "/c"]) == (Path("/t"), None, ["/c"])
    with pytest.raises(SystemExit, match="usage"):
        hf_to_gguf.split_args(["/t", "/c"])
    with pytest.raises(SystemExit, match="unexpected arguments"):
        hf_to_gguf.split_args(["/t", "--fallback", "--", "/c"])


def test_the_wrapper_falls_back_only_for_an_unknown_hash(capsys):
    class TextModel:
        def get_vocab_base_pre(self, tokenizer) -> str:
            if tokenizer == "known":
                return "qwen2-from-table"
            raise NotImplementedError("BPE pre-tokenizer was not recognized - update get_vocab_base_pre()")

    hf_to_gguf.patch_pre_tokenizer(TextModel, "qwen2")
    assert TextModel().get_vocab_base_pre("known") == "qwen2-from-table"
    assert capsys.readouterr().err == ""
    assert TextModel().get_vocab_base_pre("synthetic") == "qwen2"
    assert hf_to_gguf.FALLBACK_MARK + " 'qwen2'" in capsys.readouterr().err


def test_progress_bars_are_echoed_every_ten_percent():
    echo = gguf._Echo()
    lines = [f"Writing:  {p}%|###   | {p}M/100M [00:01<00:01, 50Mbyte/s]" for p in (0, 3, 9, 10, 15, 20, 99, 100)]
    assert [line for line in lines if echo.wanted(line)] == [lines[0], lines[3], lines[5], lines[6], lines[7]]
    assert echo.wanted("INFO:hf-to-gguf:Model successfully exported to x.gguf")


# --- vlfleet llamacpp.check's files --------------------------------------------------------------------------------

def check_doc(smoke: dict, configs: dict | None = None) -> dict:
    from ops.llamacpp import check

    doc = {"machine": {"cpu": "Intel(R) Xeon(R) Processor", "isa": ["avx2", "amx_int8"], "cpus": 2, "loadavg": "1.0"},
           "time": "2026-12-01T12:00:00Z", "binary": check.short(Path.home() / "b" / "llama-server"),
           "build": {"key": "0.3.36-abc", "flags": ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF"],
                     "compiler": "c++ 12"},
           "artifact": {"shape": "2b", "path": "~/a", "artifact_id": "gguf-1", "sizes": {"lm.gguf": 1.05e9},
                        "weight_format": {"format": "gguf", "language_model": "Q4_0", "mmproj": "q8_0"}},
           "runs": 3, "tokens": 128, "smoke": smoke, "configs": configs or {}}
    if configs:
        doc["no_repack_over_repack"] = {"first_token_s": 1.2, "ms_per_token": 1.4, "total_s": 1.3}
    return doc


def test_the_check_page_is_rendered_from_its_json(tmp_path):
    from ops.llamacpp import check

    entry = {"args": [], "cold_start_s": 5.0, "first_token_s": 3.5, "ms_per_token": 85.0, "total_s": 14.3,
             "server_timings": {"prompt_ms": 3400.0}, "peak_rss_bytes": 2.9e9}
    doc = check_doc({"ok": True, "load_s": 5.1, "first_token_s": 3.6, "prompt_tokens": 144},
                    {"repack": entry, "no-repack": {**entry, "args": ["--no-repack"], "ms_per_token": 119.0}})
    js, md = check.write(doc, tmp_path / "out")
    assert json.loads(js.read_text()) == doc and md.read_text() == check.render(doc)
    page = md.read_text()
    assert doc["binary"] == "~/b/llama-server" and "`~/b/llama-server`" in page
    assert "ISA: avx2 amx_int8" in page and "`-DGGML_NATIVE=OFF`" in page and "Smoke: passed" in page
    assert "| repack (`as built`) | 3.50 s | 85.0 | 14.30 s | 3.40 s | 5.0 s | 2.90 GB |" in page
    assert "| no-repack (`--no-repack`) | 3.50 s | 119.0 |" in page and "ms/token 1.40x" in page


def test_a_failed_smoke_is_the_pages_verdict():
    from ops.llamacpp import check

    page = check.render(check_doc({"ok": False, "error": "llama-server died while loading (SIGSEGV): x"}))
    assert "**Smoke: FAILED.** llama-server died while loading (SIGSEGV): x" in page and "| llama-server |" not in page


def test_the_share_of_others_is_what_the_machine_used_besides_our_servers(tmp_path):
    from ops.llamacpp import check

    busy, ours = check.cpu_seconds([os.getpid()])
    assert busy > 0 and 0 < ours <= busy
    assert check.others_share((100.0, 10.0), (130.0, 30.0), wall_s=10.0, cpus=2) == 0.5  # 10 of 20 CPU-seconds
    assert check.others_share((100.0, 10.0), (110.0, 30.0), wall_s=10.0, cpus=2) == 0.0
    doc = check_doc({"ok": True, "load_s": 1.0, "first_token_s": 1.0, "prompt_tokens": 1},
                    {"repack": {"args": [], "cold_start_s": 1.0, "first_token_s": 1.0, "ms_per_token": 1.0,
                                "total_s": 1.0, "others_cpu_share": 0.45}})
    assert "Other processes used 45% of the machine's CPUs" in check.render(doc) and "inflated" in check.render(doc)
