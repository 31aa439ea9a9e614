"""`search`: multi-hop questions over a local corpus generated from a seeded knowledge base, with a
BM25 search tool whose results vary in size (documents carry a varying amount of filler)."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from libra.rollout.envs.base import Task, rng_for

SYLLABLES = ["ka", "ven", "lor", "mi", "dus", "tra", "sel", "on", "bri", "zu", "pal", "re", "nox", "ti", "gar", "el"]
FILLER = ["It is known for its markets.", "Many visitors come in spring.", "The archives list several records.",
          "Local papers often mention it.", "Its history goes back centuries.", "Its records are kept in the library.",
          "Several studies describe it in detail.", "The region around it is mostly farmland."]


def _word(r, parts: int) -> str:
    return "".join(r.choice(SYLLABLES) for _ in range(parts)).capitalize()


def _tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


class BM25:
    """Okapi BM25 (k1 = 1.5, b = 0.75) over whole documents."""

    def __init__(self, docs: list[str], k1: float = 1.5, b: float = 0.75) -> None:
        self.docs = docs
        self.terms = [Counter(_tokens(d)) for d in docs]
        self.lengths = [sum(t.values()) for t in self.terms]
        self.mean_length = sum(self.lengths) / len(docs)
        df = Counter(term for t in self.terms for term in t)
        self.idf = {term: math.log(1 + (len(docs) - n + 0.5) / (n + 0.5)) for term, n in df.items()}
        self.k1, self.b = k1, b

    def search(self, query: str, k: int) -> list[int]:
        scores = []
        words = _tokens(query)  # once, not once a document (a query of 499 words took 12.5 ms)
        for i, (terms, length) in enumerate(zip(self.terms, self.lengths, strict=True)):
            score = 0.0
            for q in words:
                f = terms.get(q, 0)
                if f:
                    score += self.idf[q] * f * (self.k1 + 1) / (f + self.k1 * (1 - self.b + self.b * length / self.mean_length))
            scores.append((score, -i))
        return [-i for score, i in sorted(scores, reverse=True)[:k] if score > 0]


class SearchEnv:
    name = "search"
    tools = ("search",)
    grades_partial_work = False
    instructions = ("Answer the question by searching the library with <tool>search: QUERY</tool>; when you know, "
                    "reply <answer>NAME</answer>.")

    def __init__(self, seed: int = 0, results: int = 2) -> None:
        r = rng_for(seed, 0, "kb")
        names: set[str] = set()

        def fresh(parts: int) -> str:
            while (w := _word(r, parts)) in names:
                pass
            names.add(w)
            return w
        self.countries = [fresh(2) + "ia" for _ in range(8)]
        self.cities = {fresh(2): r.choice(self.countries) for _ in range(24)}
        self.people = {f"{fresh(2)} {fresh(2)}": r.choice(list(self.cities)) for _ in range(32)}
        self.companies = {fresh(3): (r.choice(list(self.people)), r.choice(list(self.cities))) for _ in range(24)}
        docs = []
        for company, (founder, hq) in self.companies.items():
            docs.append(f"{company} is a company founded by {founder}. Its headquarters are in {hq}. "
                        + " ".join(r.sample(FILLER, r.randint(0, 4))))
        for person, city in self.people.items():
            docs.append(f"{person} was born in {city}. " + " ".join(r.sample(FILLER, r.randint(0, 4))))
        for city, country in self.cities.items():
            docs.append(f"{city} is a city in {country}. " + " ".join(r.sample(FILLER, r.randint(0, 4))))
        self.index = BM25(docs)
        self.results = results

    def tasks(self, count: int, seed: int) -> list[Task]:
        out = []
        companies = sorted(self.companies)
        for i in range(count):
            r = rng_for(seed, i, "search")
            company = r.choice(companies)
            founder, hq = self.companies[company]
            kind = r.randrange(3)
            # the expert thinks before each search and before answering, from the question and the
            # results it has seen so far (as a ReAct agent does)
            if kind == 0:
                question, answer, hops = f"Who founded {company}?", founder, [f"{company} founder"]
                thoughts = [f"I need the founder of {company}. I will search the library for {company} and who "
                            "founded it.",
                            f"The library says {company} is a company founded by {founder}. So the founder is {founder}."]
            elif kind == 1:
                country = self.cities[hq]
                question, answer = f"In which country are the headquarters of {company}?", country
                hops = [f"{company} headquarters", f"{hq} city country"]
                thoughts = [f"I need the country of the headquarters of {company}. First I will search for the city "
                            f"where {company} has its headquarters.",
                            f"The library says the headquarters of {company} are in {hq}. Now I need the country "
                            f"that {hq} is in.",
                            f"The library says {hq} is a city in {country}. So the headquarters are in {country}."]
            else:
                born = self.people[founder]
                country = self.cities[born]
                question, answer = f"In which country was the founder of {company} born?", country
                hops = [f"{company} founder", f"{founder} born", f"{born} city country"]
                thoughts = [f"I need the country where the founder of {company} was born. First I will search for "
                            f"who founded {company}.",
                            f"The library says {company} was founded by {founder}. Next I need the city where "
                            f"{founder} was born.",
                            f"The library says {founder} was born in {born}. Now I need the country that {born} is in.",
                            f"The library says {born} is a city in {country}. So the founder was born in {country}."]
            out.append(Task("search", f"search-{seed}-{i}", question, answer, {"hops": hops, "thoughts": thoughts}))
        return out

    def open(self, task: Task, workdir: Path) -> _Episode:
        return _Episode(self, task)

    def problem(self, task: Task) -> str:
        return task.question

    def expert(self, task: Task) -> Callable[[str], str]:
        hops, thoughts = task.data["hops"], task.data["thoughts"]

        def next_turn(transcript: str) -> str:
            done = min(transcript.count("<obs"), len(hops))
            act = f"<tool>search: {hops[done]}</tool>" if done < len(hops) else f"<answer>{task.answer}</answer>"
            return f"{thoughts[done]}\n{act}"
        return next_turn


MAX_QUERY_CHARS = 1_000  # a search's query; BM25's time grows with the query's terms times the documents


class _Episode:
    def __init__(self, env: SearchEnv, task: Task) -> None:
        self.env, self.task = env, task

    def call(self, name: str, argument: str) -> tuple[str, str]:
        if not argument.strip():
            return "empty query: write <tool>search: WORDS</tool>", "error"
        if len(argument) > MAX_QUERY_CHARS:
            return f"query too long: {len(argument):,} characters, at most {MAX_QUERY_CHARS:,}; search for a few words", "error"
        hits = self.env.index.search(argument, self.env.results)
        if not hits:
            return "no results", "ok"
        return " | ".join(self.env.index.docs[i] for i in hits), "ok"

    def reward(self, answer: str) -> float:
        return 1.0 if answer.strip().lower() == self.task.answer.lower() else 0.0

    def partial_credit(self) -> float:
        return 0.0  # an answer is the title or it is not
