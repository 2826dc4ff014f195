"""ops.os_mirror: the needs read from roles/os_packages, closure handling (status, print-uris, file names), the
flat repository's index (checked by real apt against the served directory), the private apt root's config."""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from ops.os_mirror import MirrorError, index, needs
from ops.os_mirror.apt_root import AptRoot, Download, Source, parse_print_uris
from ops.os_mirror.build import MirrorSpec, key, plan, pool_name
from ops.os_mirror.serve import running

ROLE = Path(__file__).resolve().parents[2] / "roles" / "os_packages"

STATUS = """Package: nginx-light
Status: install ok installed
Version: 1.22.1-9

Package: numactl
Status: deinstall ok config-files
Version: 2.0.16-1

Package: python3.11-venv
Status: install ok half-installed
Version: 3.11.2-6

Package: apt
Status: install ok installed
Version: 2.6.1
"""


# --- needs ----------------------------------------------------------------------------------------------------
def test_every_os_packages_vars_file_has_a_suite():
    assert sorted(d.vars_name for d in needs.SUITES.values()) == sorted(p.stem for p in (ROLE / "vars").glob("*.yml"))


@pytest.mark.parametrize("suite", sorted(needs.SUITES))
def test_names_come_from_the_role(suite: str):
    vars_file = ROLE / "vars" / f"{needs.SUITES[suite].vars_name}.yml"
    assert needs.role_names(suite) == yaml.safe_load(vars_file.read_text())["os_packages_names"]


def test_unknown_suite_names_the_supported_ones():
    with pytest.raises(MirrorError, match="bookworm, jammy, noble"):
        needs.distro("buster")


def test_installed_counts_only_fully_installed_packages():
    assert needs.installed(STATUS) == {"nginx-light", "apt"}


def test_wanted_is_the_roles_first_name_per_unmet_need():
    names = needs.role_names("bookworm")
    assert needs.wanted(names) == sorted(names[n][0] for n in names)
    # nginx-light satisfies the nginx need; numactl's leftover config files do not satisfy numactl.
    assert needs.wanted(names, present=needs.installed(STATUS)) == ["libnginx-mod-http-js", "numactl",
                                                                     names["python_venv"][0]]
    assert needs.wanted(names, ["numactl"]) == ["numactl"]
    with pytest.raises(MirrorError, match="unknown need"):
        needs.wanted(names, ["gpu"])


def test_plan_reads_the_status_file(tmp_path):
    status = tmp_path / "status"
    status.write_text(STATUS)
    assert plan(MirrorSpec(status=status)) == ["libnginx-mod-http-js", "numactl", "python3.11-venv"]
    assert plan(MirrorSpec("jammy")) == ["libnginx-mod-http-js", "nginx", "numactl", "python3.10-venv"]
    with pytest.raises(MirrorError, match="does not exist"):
        plan(MirrorSpec(status=tmp_path / "missing"))


# --- source, keyring and key ----------------------------------------------------------------------------------
def test_ubuntu_suites_add_pockets_and_universe(tmp_path):
    keyring = tmp_path / "ring.gpg"
    keyring.write_bytes(b"")
    src = MirrorSpec("jammy", "http://archive.example/ubuntu/", keyring=str(keyring)).source()
    assert src.suites == ("jammy", "jammy-updates", "jammy-security")
    assert src.lines().splitlines()[0] == f"deb [signed-by={keyring}] http://archive.example/ubuntu jammy main universe"
    only = MirrorSpec("jammy", "http://archive.example/ubuntu", keyring=str(keyring), suites=("jammy",)).source()
    assert only.suites == ("jammy",)


def test_missing_keyring_names_the_fix(tmp_path):
    with pytest.raises(MirrorError, match="pass an existing --keyring"):
        MirrorSpec("bookworm", "http://m/debian", keyring=str(tmp_path / "none.gpg")).source()
    if not Path(needs.SUITES["noble"].keyring).is_file():
        with pytest.raises(MirrorError, match="apt-get install ubuntu-keyring"):
            MirrorSpec("noble", "http://archive.example/ubuntu").source()


def test_key_follows_packages_and_status(tmp_path):
    src = Source("http://m/debian", ("bookworm",), ("main",), "/k.gpg")
    status = tmp_path / "status"
    status.write_text(STATUS)
    spec = MirrorSpec(status=status)
    base = key(spec, src, ["numactl"])
    assert base == key(spec, src, ["numactl"])
    assert base != key(spec, src, ["nginx", "numactl"])
    assert base != key(MirrorSpec(), src, ["numactl"])
    status.write_text(STATUS + "\nPackage: numactl\nStatus: install ok installed\n")
    assert base != key(spec, src, ["numactl"])


# --- closure handling -----------------------------------------------------------------------------------------
def test_print_uris_and_pool_names():
    out = ("Reading package lists...\n"
           "'http://m/debian/pool/main/z/zlib/zlib1g_1.2.13.dfsg-1_amd64.deb' zlib1g_1%3a1.2.13.dfsg-1_amd64.deb "
           "86684 MD5Sum:ec42\n"
           "'http://m/debian/pool/main/g/gcc-12/gcc-12-base_12.2.0-14%2bdeb12u1_amd64.deb' "
           "gcc-12-base_12.2.0-14+deb12u1_amd64.deb 37596 SHA256:ab\n")
    found = parse_print_uris(out)
    assert [(d.filename, d.size) for d in found] == [("zlib1g_1%3a1.2.13.dfsg-1_amd64.deb", 86684),
                                                     ("gcc-12-base_12.2.0-14+deb12u1_amd64.deb", 37596)]
    # The pool's own names: no epoch (an HTTP server would decode %3a and miss the file), '+' unescaped.
    assert [pool_name(d) for d in found] == ["zlib1g_1.2.13.dfsg-1_amd64.deb",
                                             "gcc-12-base_12.2.0-14+deb12u1_amd64.deb"]
    assert parse_print_uris("0 upgraded, 0 newly installed\n") == []


def test_private_apt_root_moves_every_directory_and_clears_hooks(tmp_path):
    apt = AptRoot(tmp_path / "apt", Source("http://m/debian", ("bookworm",), ("main",), "/k.gpg"))
    apt.prepare(None)
    dump = subprocess.run(["apt-config", "-c", str(apt.config), "dump"], capture_output=True, text=True,
                          check=True).stdout
    conf = {k.lower(): v for k, v in (line.rstrip(";").split(" ", 1) for line in dump.splitlines() if " " in line)}
    root = str(tmp_path / "apt")
    for name in ("Dir::Etc::SourceList", "Dir::Etc::SourceParts", "Dir::State::Lists", "Dir::State::status",
                 "Dir::Cache::archives", "Dir::State::extended_states"):
        assert conf[name.lower()].strip('"').startswith(root), (name, conf[name.lower()])
    assert conf["dir::cache::pkgcache"] == '""'
    # The controller's hooks (e.g. docker-clean emptying /var/cache/apt/archives) do not run for this root.
    hooks = [line for line in dump.splitlines() if "Invoke" in line and line.split(" ", 1)[1] != '"";']
    assert not hooks, hooks
    assert (tmp_path / "apt/sources.list").read_text() == "deb [signed-by=/k.gpg] http://m/debian bookworm main\n"


# --- the index ------------------------------------------------------------------------------------------------
def _deb(tmp_path: Path, package: str, version: str, extra: str = "") -> Path:
    root = tmp_path / "src" / package
    (root / "DEBIAN").mkdir(parents=True)
    (root / "usr/share/doc" / package).mkdir(parents=True)
    (root / "usr/share/doc" / package / "README").write_text(f"{package}\n")
    (root / "DEBIAN/control").write_text(
        f"Package: {package}\nVersion: {version}\nArchitecture: all\nMaintainer: t <t@example.org>\n{extra}"
        f"Description: test package {package}\n second line\n .\n after a blank one\n")
    out = tmp_path / "repo" / f"{package}_{version.split(':')[-1]}_all.deb"
    out.parent.mkdir(exist_ok=True)
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(out)], check=True,
                   capture_output=True)
    return out


def _stanzas(text: str) -> dict[str, dict[str, str]]:
    out = {}
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(" "))
        out[fields["Package"]] = fields
    return out


@pytest.fixture()
def repo(tmp_path) -> Path:
    _deb(tmp_path, "vlf-lib", "1:2.0-1")
    _deb(tmp_path, "vlf-tool", "1.0-1", "Depends: vlf-lib (>= 1:2.0)\n")
    index.write(tmp_path / "repo", "test", 0)
    return tmp_path / "repo"


def test_packages_stanzas_carry_control_fields_place_size_and_hashes(repo):
    stanzas = _stanzas((repo / "Packages").read_text())
    assert set(stanzas) == {"vlf-lib", "vlf-tool"}
    for fields in stanzas.values():
        deb = repo / fields["Filename"]
        assert fields["Filename"] == f"./{deb.name}" and deb.is_file()
        assert int(fields["Size"]) == deb.stat().st_size
        assert fields["SHA256"] == hashlib.sha256(deb.read_bytes()).hexdigest()
        assert fields["MD5sum"] == hashlib.md5(deb.read_bytes()).hexdigest()
    assert stanzas["vlf-tool"]["Depends"] == "vlf-lib (>= 1:2.0)"
    assert stanzas["vlf-lib"]["Version"] == "1:2.0-1"
    assert " after a blank one" in (repo / "Packages").read_text()  # multi-line description kept


def test_release_hashes_the_indexes_and_gz_matches(repo):
    assert gzip.decompress((repo / "Packages.gz").read_bytes()) == (repo / "Packages").read_bytes()
    release = (repo / "Release").read_text()
    sha = release.split("SHA256:\n", 1)[1].splitlines()
    for name in ("Packages", "Packages.gz"):
        data = (repo / name).read_bytes()
        assert f" {hashlib.sha256(data).hexdigest()} {len(data):>10} {name}" in sha


def test_index_is_deterministic(repo):
    before = {n: (repo / n).read_bytes() for n in ("Packages", "Packages.gz", "Release")}
    index.write(repo, "test", 0)
    assert before == {n: (repo / n).read_bytes() for n in ("Packages", "Packages.gz", "Release")}


def test_control_with_index_fields_is_refused(tmp_path):
    _deb(tmp_path, "vlf-odd", "1.0", "Filename: ./elsewhere.deb\n")
    with pytest.raises(MirrorError, match="already carry Filename"):
        index.write(tmp_path / "repo", "test", 0)


def _client_config(tmp_path: Path, url: str) -> dict[str, str]:
    """A private apt client configured as the role configures hosts: the mirror alone, trusted=yes for it only."""
    root = tmp_path / "client"
    for d in ("lists/partial", "archives/partial"):
        (root / d).mkdir(parents=True)
    (root / "status").write_text("")
    (root / "sources.list").write_text(f"deb [trusted=yes] {url} ./\n")
    (root / "apt.conf").write_text("\n".join([
        f'Dir::Etc::SourceList "{root}/sources.list";', 'Dir::Etc::SourceParts "-";',
        f'Dir::State "{root}";', f'Dir::State::Lists "{root}/lists";', f'Dir::State::status "{root}/status";',
        f'Dir::Cache "{root}";', f'Dir::Cache::archives "{root}/archives";', 'Dir::Cache::pkgcache "";',
        'Dir::Cache::srcpkgcache "";', 'APT::Sandbox::User "root";', 'APT::Architecture "amd64";',
        "#clear APT::Update::Post-Invoke;", "#clear APT::Update::Post-Invoke-Success;", ""]))
    return {**os.environ, "APT_CONFIG": str(root / "apt.conf"), "LC_ALL": "C"}


def test_real_apt_installs_from_the_served_repository(repo, tmp_path):
    with running(repo, "127.0.0.1") as served:
        env = _client_config(tmp_path, served.url)
        update = subprocess.run(["apt-get", "update"], env=env, capture_output=True, text=True, timeout=60)
        assert update.returncode == 0 and "Packages" in update.stdout, update.stderr
        get = subprocess.run(["apt-get", "install", "-y", "--download-only", "vlf-tool"], env=env,
                             capture_output=True, text=True, timeout=60)
        assert get.returncode == 0, get.stdout + get.stderr
        fetched = sorted(p.name for p in (tmp_path / "client/archives").glob("*.deb"))
        assert fetched == ["vlf-lib_1%3a2.0-1_all.deb", "vlf-tool_1.0-1_all.deb"]  # the dependency came along
        assert any(p.endswith("/Packages.gz") or p.endswith("/Packages") for p in served.requests)
    with pytest.raises(urllib.error.URLError):  # the server is gone with the block
        urllib.request.urlopen(served.url + "Release", timeout=5)


def test_closure_from_real_apt_in_a_private_root(repo, tmp_path):
    with running(repo, "127.0.0.1") as served:
        apt = AptRoot(tmp_path / "apt", Source(served.url, ("./",), (), "", trusted=True))
        apt.prepare(None)
        apt.update()

        def closure() -> list[str]:
            return sorted(pool_name(d) for d in apt.resolve(["vlf-tool"]))

        assert closure() == ["vlf-lib_2.0-1_all.deb", "vlf-tool_1.0-1_all.deb"]
        apt.download(["vlf-tool"])
        assert sorted(p.name for p in apt.archives.glob("*.deb")) == ["vlf-lib_1%3a2.0-1_all.deb",
                                                                      "vlf-tool_1.0-1_all.deb"]
        assert closure() == ["vlf-lib_2.0-1_all.deb", "vlf-tool_1.0-1_all.deb"]  # still all, though cached now
        status = tmp_path / "status"
        status.write_text("Package: vlf-lib\nStatus: install ok installed\nArchitecture: all\nVersion: 1:2.0-1\n")
        apt.prepare(status)
        assert closure() == ["vlf-tool_1.0-1_all.deb"]  # what the status has is not fetched again


def test_server_lists_nothing_and_needs_a_built_mirror(repo, tmp_path):
    with running(repo, "127.0.0.1") as served:
        assert urllib.request.urlopen(served.url + "Release", timeout=5).status == 200
        with pytest.raises(urllib.error.HTTPError) as listing:
            urllib.request.urlopen(served.url, timeout=5)
        assert listing.value.code == 404
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(MirrorError, match="run `vlfleet os-mirror"), running(empty, "127.0.0.1"):
        pass


def test_collect_fails_when_apt_left_no_file(tmp_path):
    from ops.os_mirror.build import _collect

    (tmp_path / "archives").mkdir()
    (tmp_path / "work").mkdir()
    shutil.copy(__file__, tmp_path / "archives" / "a_1_all.deb")
    ok = Download("http://m/pool/a_1_all.deb", "a_1_all.deb", (tmp_path / "archives/a_1_all.deb").stat().st_size)
    _collect(tmp_path / "archives", [ok], tmp_path / "work")
    assert (tmp_path / "work/a_1_all.deb").is_file()
    with pytest.raises(MirrorError, match="--refresh"):
        _collect(tmp_path / "archives", [Download("http://m/pool/b_1_all.deb", "b_1_all.deb", 5)], tmp_path / "work")


# --- the role's side ------------------------------------------------------------------------------------------
def _role_apt_files(conf: Path, lists: Path, url: str) -> None:
    """Render roles/os_packages/tasks/mirror.yml's two files as the role would, with the paths moved under tmp."""
    import re

    import jinja2

    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters.update(dirname=os.path.dirname, regex_replace=lambda s, p, r: re.sub(p, r, s))
    tasks = yaml.safe_load((ROLE / "tasks" / "mirror.yml").read_text())
    write = next(t for t in tasks if "ansible.builtin.copy" in t)
    values = {"_os_packages_mirror_conf": str(conf), "_os_packages_mirror_lists": str(lists),
              "os_packages_mirror": url}
    for item in write["loop"]:
        Path(env.from_string(item["dest"]).render(values)).write_text(env.from_string(item["content"]).render(values))


def test_role_config_confines_apt_to_the_mirror(repo, tmp_path):
    conf, lists = tmp_path / "etc/apt.conf", tmp_path / "lists"
    conf.parent.mkdir()
    (lists / "partial").mkdir(parents=True)
    with running(repo, "127.0.0.1") as served:
        _role_apt_files(conf, lists, served.url + "//")
        assert (tmp_path / "etc/sources.list").read_text() == f"deb [trusted=yes] {served.url} ./\n"
        # The controller's own hooks and apt sandbox are not the role's business: cleared for this test only.
        test_conf = tmp_path / "test.conf"
        test_conf.write_text(conf.read_text() + 'APT::Sandbox::User "root";\n#clear APT::Update::Post-Invoke;\n'
                             "#clear APT::Update::Post-Invoke-Success;\n")
        env = {**os.environ, "APT_CONFIG": str(test_conf), "LC_ALL": "C"}
        update = subprocess.run(["apt-get", "update"], env=env, capture_output=True, text=True, timeout=60)
        assert update.returncode == 0, update.stderr
        fetched_from = {line.split()[1] for line in update.stdout.splitlines() if line.startswith(("Get:", "Hit:"))}
        assert fetched_from == {served.url.rstrip("/")}, update.stdout  # the mirror alone, not the host's sources
        assert any("_Packages" in p.name for p in lists.iterdir())  # lists of its own
        uris = subprocess.run(["apt-get", "install", "--print-uris", "-y", "-q", "vlf-tool"], env=env,
                              capture_output=True, text=True, timeout=60)
        assert uris.returncode == 0, uris.stderr
        assert served.url + "./vlf-tool_1.0-1_all.deb" in uris.stdout
