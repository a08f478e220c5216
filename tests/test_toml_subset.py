"""The TOML subset reader (ABCI's system Python 3.9 has no tomllib) gives what tomllib gives, or refuses."""

import tomllib

import pytest

from octo_dist.stack import manifest as mf
from octo_dist.stack import toml_subset

FABRICATED = [
    'a = "x"\nb = 1\nc = true\nd = false\ne = -3\nf = 1_000\ng = 2.5\nh = 1e3\n',
    '# comment\n\n  key = "v"   # trailing\n[t]\nx = 1\n[t.u]\ny = "z"\n',
    '[common.by_python."3.10".requirements]\nprotobuf = "==3.20.3"\n[common.by_python."3.11".requirements]\np = "1"\n',
    '[[p.o]]\npackage = "a"\n[[p.o]]\npackage = "b"\n[p.o.sub]\nk = 1\n[p]\nname = "n"\n',
    'arr = [\n  "3.10",  # the images\n  "3.11",\n]\nnested = [[1, 2], ["a"]]\nempty = []\n',
    'lit = \'C:\\path\\no escapes\'\nbasic = "tab\\t quote\\" back\\\\ u\\u00e9 U\\U0001F600"\n',
    'dotted.key = "v"\n"quoted key" = 1\n\'lit key\' = 2\n[x]\ny.z = 3\n',
    'crlf = 1\r\n[t]\r\nk = "v"\r\n',
    'inherit = ["numpy", "ml-dtypes"]\ngpu = "false"\nlock_pythons = "3.11"\n',
    "[a.b]\nx = 1\n[a]\ny = 2\n",  # a super-table after its sub-table
    "[[a]]\nx = 1\n[a.b]\ny = 2\n[[a]]\nx = 3\n",  # a sub-table of the last array element
    'x = "a#b" # c\n[ spaced . "q" ]\nz = 1\na = [\n]\nb = ["x",\n "y" # c\n , "z"]\n',
    "",
]


def test_the_committed_manifest_reads_the_same_as_with_tomllib():
    text = mf.DEFAULT_MANIFEST.read_text()
    assert toml_subset.loads(text) == tomllib.loads(text)
    assert toml_subset.loads(text)["profiles"]["cuda11"]["lock_pythons"] == ["3.10"]  # non-vacuous


@pytest.mark.parametrize("text", FABRICATED)
def test_fabricated_documents_read_the_same_as_with_tomllib(text):
    assert toml_subset.loads(text) == tomllib.loads(text)


@pytest.mark.parametrize(
    "text,message",
    [
        ("a = {x = 1}\n", "inline tables are outside the TOML subset"),
        ('a = """x"""\n', "multi-line strings are outside"),
        ("a = 1979-05-27\n", "dates, inf, nan and 0x/0o/0b integers are outside"),
        ("a = 0x1F\n", "0x/0o/0b integers are outside"),
        ('a = "open\n', "unterminated string"),
        ("a = 1\na = 2\n", "key 'a' is defined twice"),
        ("[t]\n[t]\n", r"\[t\] is defined twice"),
        ("a = [1, 2\nb = 3\n", "expected ',' or ']'"),
        ("a = 1 2\n", "expected the end of the line"),
        ('a = "\\q"\n', r"unknown escape \\q"),
        ("x = [1]\n[[x]]\n", "not an array of tables"),
        ("= 1\n", "expected a key"),
    ],
)
def test_what_tomllib_refuses_or_the_subset_lacks_is_refused_with_the_line(text, message):
    with pytest.raises(toml_subset.TomlSubsetError, match=message) as err:
        toml_subset.loads("# first line\n" + text)
    assert err.value.line >= 2
    if "outside" not in message:  # a real TOML error: tomllib refuses it too
        with pytest.raises(tomllib.TOMLDecodeError):
            tomllib.loads(text)


def test_the_manifest_reader_falls_back_to_the_subset_reader():
    text = mf.DEFAULT_MANIFEST.read_text()
    assert mf.loads(text, reader=toml_subset.loads) == mf.loads(text)
    m = mf.parse_manifest(mf.loads(text, reader=toml_subset.loads), mf.DEFAULT_MANIFEST)
    assert m.profile("cuda11").exact_pins()["nvidia-cudnn-cu11"] == "8.6.0.163"
