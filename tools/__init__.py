"""Scripts that write the generated files of the repository (`make sync`, `make schema`, `make cli-surface`) and
check the public surface against the last release (`make api-check`)."""
