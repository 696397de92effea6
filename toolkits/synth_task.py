"""A generated knowledge base of fictional people, cities and companies, with one- and two-hop questions.

The facts are invented, so no model can know them without searching; the passages share one form
("Vaniro Keltha was born in Osmadel."), so a tiny model can learn to copy an answer out of an
``<information>`` block. Deterministic from a seed.

    python toolkits/synth_task.py --out outputs/synth --seed 0

Writes ``corpus.jsonl`` (Search-R1 corpus format) and ``{train,val,test}.jsonl`` (FlashRAG QA
format: ``id``, ``question``, ``golden_answers``, ``metadata``). People are split into disjoint
train/val/test sets, so held-out questions are about people never seen in training.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "st", "th"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ei", "ou"]
_CODAS = ["", "", "n", "l", "r", "s", "th", "m"]
_PROFESSIONS = ["painter", "engineer", "farmer", "sailor", "teacher", "baker", "doctor", "poet", "builder",
                "merchant", "weaver", "judge"]


@dataclass(frozen=True)
class SynthSpec:
    """Size of the generated world."""

    people: int = 600
    """People (the subjects of questions); split 70/10/20 into train/val/test."""
    cities: int = 60
    """Cities (birthplaces and company seats)."""
    countries: int = 15
    """Countries (each city lies in one)."""
    companies: int = 40
    """Companies (employers)."""
    two_hop_share: float = 0.3
    """Share of questions that need two searches (person -> city -> country)."""
    seed: int = 0
    """Everything follows from this seed."""


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)).title()


def _unique_names(rng: random.Random, count: int, make) -> list[str]:
    names: list[str] = []
    seen: set[str] = set()
    while len(names) < count:
        name = make()
        if name not in seen:
            seen.add(name)
            names.append(name)
    return names


def build_world(spec: SynthSpec) -> dict:
    """The entities and their facts."""
    rng = random.Random(spec.seed)
    countries = _unique_names(rng, spec.countries, lambda: _word(rng, 2) + "ia")
    cities = _unique_names(rng, spec.cities, lambda: _word(rng, rng.choice([2, 3])))
    companies = _unique_names(rng, spec.companies, lambda: _word(rng, 2) + " " + rng.choice(["Works", "Guild", "Mills"]))
    # One-syllable names: a tiny model copies a two-token name from the question into its query far
    # more reliably than a six-token one, and there are still over a million distinct names.
    people = _unique_names(rng, spec.people, lambda: f"{_word(rng, 1)} {_word(rng, 1)}")
    city_country = {city: rng.choice(countries) for city in cities}
    company_city = {company: rng.choice(cities) for company in companies}
    persons = [{"name": name, "born_in": rng.choice(cities), "profession": rng.choice(_PROFESSIONS),
                "employer": rng.choice(companies), "born_year": rng.randint(1850, 1990)} for name in people]
    return {"countries": countries, "city_country": city_country, "company_city": company_city, "people": persons}


def corpus_rows(world: dict) -> list[dict]:
    """One passage per entity, in the Search-R1 corpus format."""
    rows = []
    for person in world["people"]:
        text = (f"{person['name']} was born in {person['born_in']} in {person['born_year']}. "
                f"{person['name']} worked as a {person['profession']} for {person['employer']}.")
        rows.append({"contents": f"\"{person['name']}\"\n{text}"})
    for city, country in world["city_country"].items():
        rows.append({"contents": f"\"{city}\"\n{city} is a city in {country}."})
    for company, city in world["company_city"].items():
        rows.append({"contents": f"\"{company}\"\n{company} is a company based in {city}."})
    return [{"id": str(i), **row} for i, row in enumerate(rows)]


# The question of each kind of fact; "country" is the two-hop one (person -> birthplace -> its country).
QUESTIONS = {"born_in": "Where was {name} born?", "profession": "What was the profession of {name}?",
             "employer": "Which company did {name} work for?", "country": "In which country was {name} born?"}


def question_fact(question: str) -> str:
    """The kind of fact a generated question asks for (a key of ``QUESTIONS``), or "other" for any other
    question. Read off the text, so it also sorts data written before the kinds were named."""
    for fact, template in QUESTIONS.items():
        opening, closing = template.split("{name}")
        if question.startswith(opening) and question.endswith(closing):
            return fact
    return "other"


def _questions_for(person: dict, world: dict, rng: random.Random, two_hop_share: float) -> dict:
    name = person["name"]
    if rng.random() < two_hop_share:
        country = world["city_country"][person["born_in"]]
        return {"question": QUESTIONS["country"].format(name=name), "golden_answers": [country],
                "metadata": {"hops": 2, "bridge": person["born_in"], "subject": name}}
    kind = rng.choice(["born_in", "profession", "employer"])
    return {"question": QUESTIONS[kind].format(name=name), "golden_answers": [person[kind]],
            "metadata": {"hops": 1, "subject": name}}


def split_questions(world: dict, spec: SynthSpec) -> dict[str, list[dict]]:
    """Disjoint people per split, one question per person."""
    rng = random.Random(spec.seed + 1)
    people = list(world["people"])
    rng.shuffle(people)
    n_train, n_val = int(0.7 * len(people)), int(0.1 * len(people))
    parts = {"train": people[:n_train], "val": people[n_train:n_train + n_val], "test": people[n_train + n_val:]}
    return {split: [{"id": f"synth-{split}-{i}", **_questions_for(p, world, rng, spec.two_hop_share)}
                    for i, p in enumerate(members)] for split, members in parts.items()}


def write_task(out: Path, spec: SynthSpec) -> dict[str, Path]:
    """Write the corpus and the three QA splits; return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    world = build_world(spec)
    paths = {"corpus": out / "corpus.jsonl"}
    paths["corpus"].write_text("".join(json.dumps(row) + "\n" for row in corpus_rows(world)))
    for split, rows in split_questions(world, spec).items():
        paths[split] = out / f"{split}.jsonl"
        paths[split].write_text("".join(json.dumps(row) + "\n" for row in rows))
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--people", type=int, default=SynthSpec.people)
    parser.add_argument("--two-hop-share", type=float, default=SynthSpec.two_hop_share)
    args = parser.parse_args(argv)
    spec = SynthSpec(people=args.people, two_hop_share=args.two_hop_share, seed=args.seed)
    paths = write_task(Path(args.out), spec)
    print("wrote " + ", ".join(f"{k}: {v}" for k, v in paths.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
