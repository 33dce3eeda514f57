"""The README stays short and its results table stays what bench/results/ says."""
import pathlib

from tools import results_table

README = pathlib.Path(results_table.README)


def test_readme_results_table_is_generated_from_the_committed_results():
    """Regenerate with `python -m tools.results_table --write` after new results."""
    assert results_table.readme_table(README.read_text()) == results_table.markdown()


def test_readme_is_under_700_words():
    assert len(README.read_text().split()) < 700
