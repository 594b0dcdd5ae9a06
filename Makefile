# The two commands of the README. Everything they need is installed by scripts/setup.sh
# into .venv/ and .cache/ (both ignored), so second runs are fast.
.PHONY: run test setup lint offload-zip

run:  ## start a local Kafka and the proxy in front of it
	scripts/run.sh $(ARGS)

test:  ## install everything and run the whole test suite
	scripts/test.sh $(ARGS)

setup:
	scripts/setup.sh --minio --toxiproxy

lint:  ## ruff, the import contracts (import-linter) and the types (mypy)
	scripts/lint.sh

offload-zip:  ## the offload jobs' code for spark-submit --py-files: dist/tierproxy-offload.zip
	python3 scripts/offload_zip.py
