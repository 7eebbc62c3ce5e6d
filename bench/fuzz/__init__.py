"""Coverage-guided fuzzing (atheris) of the framing and dispatch layer; optional, see README."""
