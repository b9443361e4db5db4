.PHONY: setup demo test bench
# One command to set up and run the main job; one to set up and run the tests (see README).
setup:
	bash scripts/setup.sh
demo:
	bash scripts/demo.sh $(ARGS)
test:
	bash scripts/test.sh $(ARGS)
bench:
	bash scripts/setup.sh && .venv/bin/python -m bench $(ARGS)
