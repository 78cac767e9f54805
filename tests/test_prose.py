"""scripts/prose.py: the word count, the machinery phrases and the References form, on small
scripts written here (the rules applied to every lesson are in tests/test_course.py)."""

from __future__ import annotations

import textwrap

from scripts import manifest, prose

SCRIPT = '''\
# %% [markdown]
# # 99 · A lesson
#
# One two three four five.

# %%
print("hi")

# %% [markdown]
# Output:
# ```text
# these words are output, not prose
# ```
#
# six seven

# %% [markdown]
# ## Summary
#
# eight nine ten

# %% [markdown]
# ## Going further
#
# a b c d

# %% [markdown]
# ## References
#
# - [`torch.Tensor.view`](https://docs.pytorch.org/docs/2.13/generated/torch.Tensor.view.html)

# %% [markdown]
# ## Exercises
#
# not counted at all
'''


def lesson_at(tmp_path, monkeypatch, text: str) -> manifest.Lesson:
    monkeypatch.setattr(manifest, "LESSONS", tmp_path)  # Lesson.dir is LESSONS / folder
    (tmp_path / "99_sample").mkdir()
    (tmp_path / "99_sample" / "sample.py").write_text(text)
    return manifest.Lesson("99", "99_sample", "A lesson", "", (), (), 1, 10, "planned")


def test_words_counts_the_main_path_and_going_further_apart(tmp_path, monkeypatch):
    lesson = lesson_at(tmp_path, monkeypatch, SCRIPT)
    # 3 + 5 (title, opening) + 1 ("Output:") + 2 + 4 (Summary with its heading) = 15; `#` and
    # `·` are not words
    assert prose.words(lesson.script) == prose.Counts(main=15, going_further=6)


def test_machinery_finds_course_talk_and_spares_plain_words(tmp_path, monkeypatch):
    text = SCRIPT.replace("# six seven", textwrap.dedent("""\
        # This is checked by `make test`, and the test asserts it on the course's machine.
        # Run `make lesson N=01` or `make exercises N=01`; make it smaller; make the copy;
        # the test of time."""))
    found = prose.machinery(lesson_at(tmp_path, monkeypatch, text))
    assert [f.split("»")[0].split("«")[1] for f in found] == ["checked by", "`make test", "the test",
                                                               "course's machine"]
    assert all(f.startswith("cell 3: ") for f in found)


def test_reference_problems():
    docs = "https://docs.pytorch.org/docs/2.13"
    ok = f"- [view]({docs}/generated/torch.Tensor.view.html)\n- [lib]({docs}/library.html)\n" \
         f"- [checkpoint]({docs}/checkpoint.html)\n- [paper](https://arxiv.org/abs/1706.03762)"
    assert prose.reference_problems(ok, "2.13") == []
    assert prose.reference_problems("", "2.13") == ["References lists nothing (one `- [title](link)` per line)"]
    bad = {
        "- [v](https://docs.pytorch.org/docs/2.12/generated/torch.Tensor.view.html)":
            "not the pinned release's documentation (2.13)",
        f"- [v]({docs}/generated/torch.Tensor.no_such_method.html)": "is not an object in the installed torch",
        f"- [m]({docs}/no_such_module.html)": "is not an object in the installed torch",
        f"- [m]({docs}/scripts.html)": "is not an object in the installed torch",  # the course's, not torch's
        "- [blog](https://example.com/post)": "neither docs.pytorch.org",
        "- a paper without a link": "no link in",
    }
    for item, message in bad.items():
        (problem,) = prose.reference_problems(item, "2.13")
        assert message in problem, (item, problem)


def test_pinned_release_is_the_pin():
    assert prose.pinned_release() == "2.13"


def test_allowed_excuses_only_its_own_text(tmp_path, monkeypatch):
    text = SCRIPT.replace("# six seven", "# Here the test of your code is `make exercises`, and the test asserts it.")
    lesson = lesson_at(tmp_path, monkeypatch, text)
    monkeypatch.setattr(prose, "ALLOWED", {("99", "the test asserts it"): "a reason"})
    assert prose.machinery(lesson) == []
    monkeypatch.setattr(prose, "ALLOWED", {("98", "the test asserts it"): "another lesson's"})
    assert len(prose.machinery(lesson)) == 1
    monkeypatch.setattr(prose, "ALLOWED", {("99", "Here"): "elsewhere in the cell"})
    assert len(prose.machinery(lesson)) == 1
