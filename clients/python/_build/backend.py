"""A PEP 517 build backend for this pure-Python package, with no build
dependency at all: pip installs it offline with any interpreter, with or
without build isolation, whether or not `wheel` or setuptools are there
(setuptools before 70.1 needs `wheel` for bdist_wheel, and a fresh venv of
a pyenv or python.org Python has none).

It writes the wheel (PEP 427) with zipfile from pyproject.toml's [project]
table, which stays the one place the metadata is written.
"""

import base64
import hashlib
import os
import re
import tarfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "dispatcher_producer"


def _project():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        text = f.read().decode("utf-8")
    try:
        import tomllib  # Python 3.11+

        return tomllib.loads(text)["project"]
    except ImportError:
        # Python 3.9 and 3.10: the few fields used here, as written above.
        body = text.split("[project]", 1)[1].split("\n[", 1)[0]

        def field(name):
            m = re.search(r'^%s\s*=\s*"([^"]*)"' % re.escape(name), body, re.M)
            return m.group(1) if m else None

        deps = re.search(r"^dependencies\s*=\s*\[([^\]]*)\]", body, re.M)
        return {
            "name": field("name"),
            "version": field("version"),
            "description": field("description"),
            "requires-python": field("requires-python"),
            "dependencies": re.findall(r'"([^"]*)"', deps.group(1)) if deps else [],
        }


def _dist(p):
    return "%s-%s" % (p["name"].replace("-", "_"), p["version"])


def _metadata(p):
    lines = ["Metadata-Version: 2.1", "Name: " + p["name"], "Version: " + p["version"]]
    if p.get("description"):
        lines.append("Summary: " + p["description"])
    lines.append("License: Apache-2.0")
    if p.get("requires-python"):
        lines.append("Requires-Python: " + p["requires-python"])
    lines += ["Requires-Dist: " + d for d in p.get("dependencies", [])]
    readme = os.path.join(ROOT, "README.md")
    body = ""
    if os.path.exists(readme):
        lines.append("Description-Content-Type: text/markdown")
        with open(readme, encoding="utf-8") as f:
            body = f.read()
    return "\n".join(lines) + "\n\n" + body


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    p = _project()
    info = os.path.join(metadata_directory, _dist(p) + ".dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata(p))
    return os.path.basename(info)


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (name, digest, len(data))


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    p = _project()
    dist = _dist(p)
    info = dist + ".dist-info"
    files = []
    pkg = os.path.join(ROOT, PACKAGE)
    for name in sorted(os.listdir(pkg)):
        if name.endswith(".py"):
            with open(os.path.join(pkg, name), "rb") as f:
                files.append(("%s/%s" % (PACKAGE, name), f.read()))
    files.append((info + "/METADATA", _metadata(p).encode("utf-8")))
    wheel_meta = "Wheel-Version: 1.0\nGenerator: dispatcher_producer _build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files.append((info + "/WHEEL", wheel_meta.encode()))
    record = [_record_line(n, d) for n, d in files] + [info + "/RECORD,,"]
    files.append((info + "/RECORD", ("\n".join(record) + "\n").encode()))
    name = dist + "-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files:
            z.writestr(n, d)
    return name


def build_sdist(sdist_directory, config_settings=None):
    p = _project()
    dist = p["name"].replace("-", "_") + "-" + p["version"]
    name = dist + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        for rel in ["pyproject.toml", "README.md", "_build/backend.py"] + [
            PACKAGE + "/" + n for n in sorted(os.listdir(os.path.join(ROOT, PACKAGE))) if n.endswith(".py")
        ]:
            if os.path.exists(os.path.join(ROOT, rel)):
                t.add(os.path.join(ROOT, rel), arcname=dist + "/" + rel)
        info = tarfile.TarInfo(dist + "/PKG-INFO")
        data = _metadata(p).encode("utf-8")
        info.size = len(data)
        import io

        t.addfile(info, io.BytesIO(data))
    return name
