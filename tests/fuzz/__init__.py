"""Coverage-guided fuzzing (atheris) of everything that parses bytes from the network or disk."""
