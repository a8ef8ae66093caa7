"""Scripts that write the generated files of the repository: `make sync` and `make schema`."""
