"""The fixed question set of ``bench.bench_offline``: simple questions with checkable answers.

Each answer is checked the same way for both sides (the plain model and the agent): it is
correct when it mentions an accepted form (whole words, case-insensitive) before any of the
question's wrong forms (another number, another city, another colour): the first candidate an
answer names is its answer, so one that lists everything it knows is not counted correct.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Question:
    """One question; ``accept`` and ``reject`` are regular expressions matched as whole words.

    ``at_least`` > 1 asks for that many distinct ``accept`` matches ("name three colours").
    """

    kind: str
    text: str
    accept: tuple[str, ...]
    reject: tuple[str, ...] = field(default=())
    at_least: int = 1

    def check(self, answer: str | None) -> bool:
        """Whether ``answer`` is right (see the module docstring)."""
        if not answer:
            return False
        text = answer.lower()
        found = {pattern for pattern in self.accept if _words(pattern).search(text)}
        if len(found) < self.at_least:
            return False
        first_right = min(_first(pattern, text) for pattern in found)
        return all(_first(pattern, text) > first_right for pattern in self.reject)


def _words(pattern: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w-])(?:{pattern})(?![\w-])")


def _first(pattern: str, text: str) -> float:
    match = _words(pattern).search(text)
    return match.start() if match else float("inf")


def _number(value: int, *words: str) -> tuple[str, ...]:
    return (str(value), *words)


def _arithmetic(text: str, value: int, *words: str, kind: str = "arithmetic") -> Question:
    # Any other number stated first is a wrong result ("2 + 2 = 5"); the operands are not.
    operands = {int(n) for n in re.findall(r"\d+", text)}
    wrong = tuple(str(n) for n in range(0, 201) if n != value and n not in operands)
    return Question(kind, text, _number(value, *words), wrong)


COLOURS = ("red", "orange", "yellow", "green", "blue", "purple", "violet", "pink", "brown",
           "black", "white", "gr[ae]y", "indigo", "magenta", "cyan", "gold", "silver")
CAPITALS = ("paris", "berlin", "rome", "madrid", "london", "tokyo", "ottawa", "canberra",
            "moscow", "beijing", "cairo", "athens", "lisbon", "vienna", "washington",
            "dublin", "oslo", "stockholm", "warsaw", "brasília|brasilia", "delhi", "new delhi")


def _capital(country: str, capital: str) -> Question:
    wrong = tuple(c for c in CAPITALS if c != capital and capital not in c.split("|"))
    if capital == "delhi":
        wrong = tuple(c for c in wrong if c != "new delhi")
    return Question("capital", f"What is the capital of {country}?", (capital,), wrong)


def _colour(text: str, *accept: str) -> Question:
    wrong = tuple(c for c in COLOURS if c not in accept)
    return Question("colour", text, accept, wrong)


QUESTIONS: tuple[Question, ...] = (
    # arithmetic
    _arithmetic("What is 2 + 2?", 4, "four"),
    _arithmetic("What is 3 + 5?", 8, "eight"),
    _arithmetic("What is 7 times 8?", 56, "fifty-six"),
    _arithmetic("What is 10 minus 3?", 7, "seven"),
    _arithmetic("What is 9 + 10?", 19, "nineteen"),
    _arithmetic("What is 6 times 7?", 42, "forty-two"),
    _arithmetic("What is 100 divided by 4?", 25, "twenty-five"),
    _arithmetic("What is 15 + 27?", 42, "forty-two"),
    _arithmetic("What is 12 times 12?", 144),
    _arithmetic("What is 50 minus 18?", 32, "thirty-two"),
    _arithmetic("What is 1 + 1?", 2, "two"),
    _arithmetic("What is 5 times 5?", 25, "twenty-five"),
    _arithmetic("How many days are there in a week?", 7, "seven"),
    _arithmetic("How many legs does a spider have?", 8, "eight"),
    _arithmetic("How many minutes are in an hour?", 60, "sixty"),
    # capitals
    _capital("France", "paris"),
    _capital("Germany", "berlin"),
    _capital("Italy", "rome"),
    _capital("Spain", "madrid"),
    _capital("Japan", "tokyo"),
    _capital("the United Kingdom", "london"),
    _capital("Russia", "moscow"),
    _capital("China", "beijing"),
    _capital("Egypt", "cairo"),
    _capital("Greece", "athens"),
    _capital("Portugal", "lisbon"),
    _capital("Austria", "vienna"),
    # colours
    _colour("What colour is the sky on a clear day?", "blue"),
    _colour("What colour is grass?", "green"),
    _colour("What colour is a ripe banana?", "yellow"),
    _colour("What colour is snow?", "white"),
    _colour("What colour is coal?", "black"),
    _colour("What colour do you get by mixing blue and yellow?", "green"),
    _colour("What colour is a ripe tomato?", "red"),
    Question("colour", "Name three colours.", COLOURS, at_least=3),
    # one-step facts
    Question("fact", "What is the largest planet in our solar system?", ("jupiter",),
             ("saturn", "earth", "mars", "neptune", "uranus", "venus", "mercury")),
    Question("fact", "What is the opposite of hot?", ("cold",)),
    Question("fact", "What is the opposite of up?", ("down",)),
    Question("fact", "What animal says moo?", ("cows?",), ("dogs?", "cats?", "sheep")),
    Question("fact", "What is frozen water called?", ("ice",)),
    Question("fact", "Which planet do we live on?", ("earth",),
             ("mars", "jupiter", "venus", "saturn")),
    Question("fact", "What gas do humans need to breathe to live?", ("oxygen",)),
    _arithmetic("At how many degrees Celsius does water boil?", 100, "one hundred", kind="fact"),
    Question("fact", "What do bees make?", ("honey",)),
    Question("fact", "What is the closest star to the Earth?", ("the sun", "sun"),
             ("proxima",)),
    Question("fact", "In which ocean is Hawaii?", ("pacific",),
             ("atlantic", "indian", "arctic")),
    Question("fact", "What language is mainly spoken in Brazil?", ("portuguese",),
             ("spanish",)),
    # short instructions
    Question("instruction", "Say hello in Spanish.", ("hola",)),
    Question("instruction", "Translate 'thank you' into French.", ("merci",)),
    Question("instruction", "Reply with only the word yes.", ("yes",), ("no",)),
    Question("instruction", "Write the number five as a digit.", ("5",),
             tuple(str(n) for n in range(10) if n != 5)),
    Question("instruction", "Repeat this word: banana.", ("banana",)),
    Question("instruction", "What is the plural of mouse?", ("mice",), ("mouses",)),
    Question("instruction", "Give one word that rhymes with cat.",
             ("hat", "bat", "mat", "rat", "sat", "fat", "pat", "that", "flat", "chat",
              "brat", "vat", "spat", "gnat", "splat", "scat", "at")),
    Question("instruction", "Name a fruit that is yellow.", ("bananas?", "lemons?",
                                                              "pineapples?", "mangos?",
                                                              "mangoes")),
)
"""Fifty-five questions: 15 arithmetic, 12 capitals, 8 colours, 12 facts, 8 instructions."""
