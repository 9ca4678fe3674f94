"""The README's Python usage runs as written (the ```python block after its marker)."""
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
MARKER = "<!-- readme-python-example -->"


def readme_block():
    text = README.read_text()
    assert MARKER in text, f"README.md has no {MARKER} marker"
    rest = text[text.index(MARKER):]
    start = rest.index("```python\n") + len("```python\n")
    return rest[start:rest.index("\n```", start)]


def test_readme_python_example_runs(capsys):
    code = readme_block()
    scope = {"__name__": "readme_example"}
    exec(compile(code, "README.md (python example)", "exec"), scope)
    out = capsys.readouterr().out
    sparse = int(re.search(r"SavedBytes\(sparse=(\d+), masks=(\d+)", out).group(1))
    assert sparse > 0  # the example packed its layers' inputs
    assert not scope["handle"].layers  # and removed its hooks
