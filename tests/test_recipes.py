"""Recipes by name: ``dare recipes`` lists and prints them, ``dare train NAME`` and ``load_train_config(NAME)`` read
them from any directory, a recipe path typed outside the repository reads the shipped copy after a note, a typo is a
one-line error naming the closest recipe, and the wheel's build copies exactly the recipe families into the package."""

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import one_line_error

from dare.cli import main
from dare.errors import ConfigError
from dare.recipes import FAMILIES, description, recipes, resolve_recipe

ROOT = Path(__file__).resolve().parents[1]
RECIPE_FILES = sorted(path for family in ("dream", "llada", "llada2", "sdar")
                      for path in (ROOT / "configs" / family).glob("*.yaml"))
"""The recipe files of the repository, listed here independently of dare.recipes."""


def name_of(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


def header(path: Path) -> str:
    """The file's first line, which every recipe starts with as a ``# `` comment, without the ``# ``."""
    first = path.read_text().splitlines()[0]
    assert first.startswith("# "), f"{path} does not start with a '# ...' description line"
    return first[2:].strip()


def check_description(text: str, path: Path) -> None:
    """``text`` opens the recipe's leading comment (its first line and what follows, joined), within the width,
    possibly cut at a word (an ellipsis), never empty."""
    from dare.recipes import DESCRIPTION_WIDTH

    lead = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lead += line[1:].split()
    joined = " ".join(lead)
    assert text and len(text) <= DESCRIPTION_WIDTH, text
    assert joined.startswith(text.removesuffix("…")) and header(path).startswith(text.removesuffix("…")[:20]), text


def test_the_repository_has_recipes_in_every_family():
    assert {path.parent.name for path in RECIPE_FILES} == set(FAMILIES)
    assert len(RECIPE_FILES) > 40


def test_every_recipe_file_is_registered_by_its_name():
    assert list(recipes()) == sorted(map(name_of, RECIPE_FILES))


@pytest.mark.parametrize("path", RECIPE_FILES, ids=name_of)
def test_every_recipe_name_resolves_to_its_file_and_description(path):
    name = name_of(path)
    for typed in (name, f"{name}.yaml"):
        found = recipes()[name]
        assert Path(resolve_recipe(typed)) == found and found.is_file()
        assert found.read_text() == path.read_text()
    check_description(description(recipes()[name]), path)


def test_the_listing_has_one_aligned_line_per_recipe(capsys):
    assert main(["recipes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(RECIPE_FILES)
    width = max(len(name_of(path)) for path in RECIPE_FILES)
    for line, path in zip(lines, RECIPE_FILES):
        kind = "cpu" if path.stem.endswith("_tiny") else "gpu"
        assert line.startswith(f"{name_of(path):<{width}}  {kind}  ")
        check_description(line[width + 7:], path)
    assert "llada/sft_tiny" in {line.split()[0] for line in lines if line.split()[1] == "cpu"}
    assert "llada/d1_8b" in {line.split()[0] for line in lines if line.split()[1] == "gpu"}


@pytest.mark.parametrize("typed", ["llada/sft_tiny", "llada/sft_tiny.yaml"])
def test_dare_recipes_name_prints_the_file_unchanged(typed, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["recipes", typed]) == 0
    out, err = capsys.readouterr()
    assert out == (ROOT / "configs" / "llada" / "sft_tiny.yaml").read_text() and err == ""


def test_dare_recipes_does_not_import_torch():
    code = ("import sys, contextlib, io\nfrom dare.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    assert main(['recipes']) == 0\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_a_repository_path_typed_elsewhere_reads_the_shipped_recipe_with_a_note(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    found = resolve_recipe("configs/llada/sft_tiny.yaml")
    assert found == recipes()["llada/sft_tiny"]
    assert capsys.readouterr().err == (f"note: configs/llada/sft_tiny.yaml does not exist here; using the recipe "
                                       f"llada/sft_tiny of this installation ({found})\n")


def test_an_existing_file_wins_over_the_shipped_recipe(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    own = tmp_path / "configs" / "llada" / "sft_tiny.yaml"
    own.parent.mkdir(parents=True)
    own.write_text("# mine\ntrainer:\n  max_steps: 3\n")
    assert resolve_recipe("configs/llada/sft_tiny.yaml") == "configs/llada/sft_tiny.yaml"
    assert resolve_recipe(own) == own
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("typed, message", [
    ("configs/llada/sft_tny.yaml", "config file configs/llada/sft_tny.yaml does not exist (did you mean "
                                   "configs/llada/sft_tiny.yaml?); dare recipes lists the recipes"),
    ("llada/sft_tny", "no recipe named llada/sft_tny (did you mean llada/sft_tiny?); dare recipes lists the recipes"),
    ("lada/d1_tiny.yaml", "config file lada/d1_tiny.yaml does not exist (did you mean llada/d1_tiny.yaml?); dare "
                          "recipes lists the recipes"),
    ("nothing/like/it.yaml", "config file nothing/like/it.yaml does not exist; dare recipes lists the recipes"),
])
def test_a_typo_names_the_closest_recipe(typed, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        resolve_recipe(typed)
    assert str(err.value) == message
    assert one_line_error(capsys, "train", typed, "--dry-run") == f"error: {message}"
    assert one_line_error(capsys, "recipes", typed) == f"error: {message}"


def test_load_train_config_takes_a_name_and_a_path_typed_elsewhere(tmp_path, monkeypatch):
    from dare.trainer.config import load_train_config

    in_repository = load_train_config(ROOT / "configs" / "llada" / "d1_tiny.yaml", ["trainer.max_steps=2"])
    monkeypatch.chdir(tmp_path)
    assert load_train_config("llada/d1_tiny", ["trainer.max_steps=2"]) == in_repository
    assert load_train_config("configs/llada/d1_tiny.yaml", ["trainer.max_steps=2"]) == in_repository


def test_dare_train_name_dry_run_and_show_config(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert main(["train", "configs/llada/sft_tiny.yaml", "--dry-run"]) == 0
    by_path = capsys.readouterr().out
    monkeypatch.chdir(tmp_path)
    assert main(["train", "llada/sft_tiny", "--dry-run"]) == 0
    by_name = capsys.readouterr()
    assert by_name.out == by_path and "note:" not in by_name.err
    assert main(["train", "llada/sft_tiny", "trainer.max_steps=2", "--show-config"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "# llada/sft_tiny with trainer.max_steps=2"
    assert list(tmp_path.iterdir()) == []  # the dry run wrote nothing


def namespace(config, *overrides) -> argparse.Namespace:
    return argparse.Namespace(config=config, overrides=list(overrides), show_config=False, dry_run=False)


def test_split_recipe_takes_a_bare_name_as_the_recipe(tmp_path, monkeypatch):
    from dare.commands.train import looks_like_recipe, resume_command, split_recipe

    monkeypatch.chdir(tmp_path)
    assert split_recipe(namespace("llada/d1_tiny", "trainer.max_steps=2")) == ("llada/d1_tiny", ["trainer.max_steps=2"])
    assert looks_like_recipe("llada/d1_tiny") and looks_like_recipe("llada/d1_tiny.yaml")
    assert not looks_like_recipe("llada/d1_tiny=2") and not looks_like_recipe("optim.lr")
    with pytest.raises(ConfigError, match="the recipe must come first, before the key=value overrides: dare train "
                                          "llada/d1_tiny trainer.max_steps=2$"):
        split_recipe(namespace("trainer.max_steps=2", "llada/d1_tiny"))
    with pytest.raises(ConfigError, match="one recipe per run: got llada/sft_tiny and llada/d1_tiny"):
        split_recipe(namespace("llada/sft_tiny", "llada/d1_tiny"))
    assert resume_command("llada/d1_tiny", ["trainer.resume=never"]) == "dare train llada/d1_tiny trainer.resume=auto"


# ------------------------------------------------------------------------------------------------ the wheel's recipes
def build_script():
    """The repository's setup.py as a module (its setup() call runs only as a script)."""
    spec = importlib.util.spec_from_file_location("dare_setup_under_test", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_build_copies_exactly_the_recipe_families(tmp_path):
    setup = build_script()
    assert setup.FAMILIES == FAMILIES
    configs, package = tmp_path / "configs", tmp_path / "build" / "dare"
    wanted = {"dream/a.yaml", "llada/b.yaml", "llada/c.yaml", "llada2/d.yaml", "sdar/e.yaml"}
    others = {"lm_eval/f.yaml", "opencompass/g.py", "llada/notes.txt", "llada/nested/h.yaml", "top.yaml"}
    for relative in wanted | others:
        (configs / relative).parent.mkdir(parents=True, exist_ok=True)
        (configs / relative).write_text(f"# {relative}\n")
    stale = package / "configs" / "llada" / "removed.yaml"  # from an earlier build
    stale.parent.mkdir(parents=True)
    stale.write_text("# gone\n")
    written = setup.copy_recipes(configs, package)
    copied = {str(p.relative_to(package / "configs")) for p in (package / "configs").rglob("*") if p.is_file()}
    assert copied == wanted == {str(p.relative_to(package / "configs")) for p in written}
    assert all((package / "configs" / r).read_text() == f"# {r}\n" for r in wanted)
    (configs / "sdar" / "e.yaml").unlink()
    (configs / "sdar").rmdir()
    with pytest.raises(FileNotFoundError, match="sdar does not exist"):
        setup.copy_recipes(configs, package)


def test_the_build_copies_every_registered_recipe(tmp_path):
    written = build_script().copy_recipes(ROOT / "configs", tmp_path / "dare")
    assert sorted(f"{p.parent.name}/{p.stem}" for p in written) == list(recipes())
    manifest = (ROOT / "MANIFEST.in").read_text()  # the sdist carries what the wheel's build copies
    assert all(f"configs/{family}/*.yaml" in manifest for family in FAMILIES)


def test_a_missing_path_of_the_users_own_is_never_replaced_by_a_shipped_recipe(tmp_path, monkeypatch):
    """Only the repository's layout (``[...]/configs/<family>/<name>.yaml``) may stand for a shipped recipe; a
    mistyped path to an edited copy (``myexpt/llada/sft_tiny.yaml``, an absolute path) is an error, never the shipped
    settings trained under a note."""
    from dare.errors import ConfigError
    from dare.recipes import resolve_recipe

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"^config file myexpt/llada/sft_tiny\.yaml does not exist \(the shipped recipe "
                                          r"with that name is llada/sft_tiny: dare train llada/sft_tiny\)$"):
        resolve_recipe("myexpt/llada/sft_tiny.yaml")
    with pytest.raises(ConfigError, match=r"^config file /x/llada/sft_tny\.yaml does not exist \(did you mean the "
                                          r"shipped recipe llada/sft_tiny\?\)"):
        resolve_recipe("/x/llada/sft_tny.yaml")
    assert str(resolve_recipe("configs/llada/sft_tiny.yaml")).endswith("llada/sft_tiny.yaml")


def test_harness_configs_are_named_as_such(tmp_path, monkeypatch):
    from dare.errors import ConfigError
    from dare.recipes import resolve_recipe

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"^lm_eval/dare_tiny_gen is not a training recipe: configs/lm_eval/ holds "
                                          r"lm-evaluation-harness tasks"):
        resolve_recipe("lm_eval/dare_tiny_gen")


def test_descriptions_are_first_sentences_within_the_width(tmp_path):
    from dare.recipes import DESCRIPTION_WIDTH, description

    recipe = tmp_path / "r.yaml"
    recipe.write_text("# Tiny d1 on CPU: a random model.\n# Second sentence here.\nmodel:\n  path: x\n")
    assert description(recipe) == "Tiny d1 on CPU: a random model."
    recipe.write_text("# " + "word " * 60 + "\n# more\nmodel: {}\n")
    text = description(recipe)
    assert len(text) <= DESCRIPTION_WIDTH and text.endswith("word…")


@pytest.mark.parametrize("argv, expected", [
    (["train", "llada/d1_tny"], "error: no recipe named llada/d1_tny (did you mean llada/d1_tiny?); dare recipes "
                                "lists the recipes"),
    (["train", "my_reward.py"], "error: my_reward.py is Python, not a YAML recipe: a plug-in of your own goes in as "
                                "imports=[my_reward.py] after the recipe (dare train RECIPE imports=[FILE.py])"),
    (["train", "trainer.max_steps=2", "llada/d1_tiny"], "error: the recipe must come first, before the key=value "
                                                         "overrides: dare train llada/d1_tiny trainer.max_steps=2"),
])
def test_a_mistyped_recipe_answers_before_torch_is_imported(argv, expected, tmp_path):
    """dare train's precheck: the recipe argument's errors come before the ~5 s torch import."""
    code = ("import sys; from dare.cli import main; code = main(sys.argv[1:]); "
            "print(code, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    assert done.stdout.split() == ["2", "False"], done.stdout + done.stderr
    assert done.stderr.strip() == expected


def test_a_bare_recipe_name_names_every_family_that_has_it_and_a_family_lists_its_own(capsys):
    """Before: sft_tiny suggested sdar/sft_tiny alone (the README uses llada/sft_tiny); llada suggested llada/d1_8b."""
    assert one_line_error(capsys, "train", "sft_tiny") == (
        "error: no recipe named sft_tiny (did you mean dream/sft_tiny, llada/sft_tiny, llada2/sft_tiny, "
        "sdar/sft_tiny?); dare recipes lists the recipes")
    assert one_line_error(capsys, "train", "llada") == (
        "error: llada is a family, not a recipe: its recipes are llada/NAME; dare recipes llada lists them")
    assert main(["recipes", "llada"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert names == [name for name in recipes() if name.startswith("llada/")] and "llada/sft_tiny" in names


def test_a_mistyped_bare_name_or_family_gets_a_hint_of_its_kind(capsys):
    """Before: 'dare recipes lama' said only 'no recipe named lama', sdarr suggested sdar/tracerl_8b and d1_tny one
    family's d1_tiny at random."""
    assert one_line_error(capsys, "recipes", "lama") == (
        "error: no recipe or family named lama (did you mean llada?); dare recipes lists the recipes")
    assert one_line_error(capsys, "train", "sdarr") == (
        "error: no recipe or family named sdarr (did you mean sdar?); dare recipes lists the recipes")
    assert one_line_error(capsys, "train", "d1_tny") == (
        "error: no recipe named d1_tny (did you mean llada/d1_tiny, sdar/d1_tiny?); dare recipes lists the recipes")
