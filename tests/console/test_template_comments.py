"""Django's {# #} comment ends at the end of its line: one spread over several lines is printed
on the page. Every template says longer comments with {% comment %}."""

from pathlib import Path

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


def test_no_template_opens_a_one_line_comment_it_does_not_close_on_that_line():
    unclosed = [f"{path.relative_to(TEMPLATES)}:{n}" for path in sorted(TEMPLATES.rglob("*.html"))
                for n, line in enumerate(path.read_text().splitlines(), 1)
                if "{#" in line and "#}" not in line.split("{#", 1)[1]]
    assert unclosed == []
