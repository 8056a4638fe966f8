#!/usr/bin/env python3
"""Writes the multiple-choice and generation tasks tests/lm_eval.rs runs lm-evaluation-harness
on (no dataset hub is reachable from CI, so the data is made here, for this test, and committed):
edge_mc.jsonl (four choices per question, 200+ questions a 135M model can mostly answer) and
edge_gen.jsonl (short answers to generate). Deterministic: rerunning rewrites the same files."""
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent

CAPITALS = [("France", "Paris"), ("Germany", "Berlin"), ("Spain", "Madrid"), ("Italy", "Rome"),
            ("Japan", "Tokyo"), ("China", "Beijing"), ("Russia", "Moscow"), ("England", "London"),
            ("Egypt", "Cairo"), ("Greece", "Athens"), ("Portugal", "Lisbon"), ("Austria", "Vienna"),
            ("Poland", "Warsaw"), ("Ireland", "Dublin"), ("Norway", "Oslo"), ("Sweden", "Stockholm"),
            ("Finland", "Helsinki"), ("Denmark", "Copenhagen"), ("Canada", "Ottawa"),
            ("Australia", "Canberra"), ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Cuba", "Havana"),
            ("Thailand", "Bangkok"), ("Turkey", "Ankara"), ("Iran", "Tehran"), ("Iraq", "Baghdad"),
            ("Hungary", "Budapest"), ("Belgium", "Brussels"), ("Argentina", "Buenos Aires")]
OPPOSITES = [("hot", "cold"), ("big", "small"), ("up", "down"), ("fast", "slow"), ("happy", "sad"),
             ("light", "dark"), ("old", "young"), ("open", "closed"), ("rich", "poor"),
             ("strong", "weak"), ("early", "late"), ("full", "empty"), ("hard", "soft"),
             ("high", "low"), ("long", "short"), ("wet", "dry"), ("good", "bad"), ("left", "right"),
             ("true", "false"), ("day", "night"), ("black", "white"), ("win", "lose"),
             ("begin", "end"), ("love", "hate"), ("loud", "quiet"), ("thick", "thin"),
             ("clean", "dirty"), ("push", "pull"), ("buy", "sell"), ("north", "south"),
             ("east", "west"), ("question", "answer"), ("first", "last"), ("inside", "outside"),
             ("top", "bottom"), ("cheap", "expensive"), ("friend", "enemy"), ("alive", "dead")]
PLURALS = [("child", "children"), ("mouse", "mice"), ("man", "men"), ("woman", "women"),
           ("tooth", "teeth"), ("foot", "feet"), ("goose", "geese"), ("person", "people"),
           ("cat", "cats"), ("dog", "dogs"), ("box", "boxes"), ("bus", "buses"), ("city", "cities"),
           ("baby", "babies"), ("knife", "knives"), ("leaf", "leaves"), ("wolf", "wolves"),
           ("ox", "oxen"), ("car", "cars"), ("tree", "trees"), ("house", "houses"),
           ("church", "churches"), ("glass", "glasses"), ("party", "parties"),
           ("story", "stories"), ("potato", "potatoes"), ("hero", "heroes"), ("life", "lives")]
PAST = [("go", "went"), ("eat", "ate"), ("see", "saw"), ("run", "ran"), ("write", "wrote"),
        ("take", "took"), ("give", "gave"), ("come", "came"), ("sing", "sang"), ("drink", "drank"),
        ("swim", "swam"), ("begin", "began"), ("buy", "bought"), ("bring", "brought"),
        ("think", "thought"), ("teach", "taught"), ("catch", "caught"), ("fly", "flew"),
        ("know", "knew"), ("grow", "grew"), ("draw", "drew"), ("speak", "spoke"),
        ("break", "broke"), ("choose", "chose"), ("drive", "drove"), ("ride", "rode"),
        ("fall", "fell"), ("feel", "felt"), ("sleep", "slept"), ("sit", "sat")]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]
NUMBERS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
           "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
           "eighteen", "nineteen", "twenty", "twenty-one"]
COLORS = [("the sky", "blue"), ("grass", "green"), ("snow", "white"), ("coal", "black"),
          ("blood", "red"), ("a banana", "yellow"), ("a lemon", "yellow"), ("milk", "white"),
          ("a leaf in summer", "green"), ("the sea", "blue"), ("a strawberry", "red"),
          ("the night sky", "black")]


def category(rng, name, shots, items, template):
    """Questions over `items` ((key, answer) pairs): a few solved examples of the same kind
    (shared by every question of the category: a prompt prefix the prefix cache can share),
    then the question; three distractors drawn from the other answers."""
    header = "".join(template.format(k) + " " + a + ".\n" for k, a in shots)
    answers = sorted({a for _, a in items})
    out = []
    for k, a in items:
        others = [x for x in answers if x != a]
        choices = rng.sample(others, 3) + [a]
        rng.shuffle(choices)
        out.append({"category": name, "question": header + template.format(k),
                    "choices": choices, "answer": choices.index(a)})
    return out


def main():
    rng = random.Random(20261128)
    docs = []
    docs += category(rng, "capital", [("Chile", "Santiago"), ("Nepal", "Kathmandu"), ("Mali", "Bamako")],
                     CAPITALS, "The capital of {} is")
    docs += category(rng, "opposite", [("near", "far"), ("wide", "narrow"), ("sharp", "dull")],
                     OPPOSITES, "The opposite of {} is")
    docs += category(rng, "opposite-back", [("far", "near"), ("narrow", "wide"), ("dull", "sharp")],
                     [(b, a) for a, b in OPPOSITES], "The opposite of {} is")
    docs += category(rng, "plural", [("cup", "cups"), ("louse", "lice"), ("shelf", "shelves")],
                     PLURALS, "The plural of {} is")
    docs += category(rng, "past", [("stand", "stood"), ("hold", "held"), ("wear", "wore")],
                     PAST, "The past tense of {} is")
    docs += category(rng, "day", [("Sunday", "Monday")],
                     [(d, DAYS[(i + 1) % 7]) for i, d in enumerate(DAYS)], "The day after {} is")
    docs += category(rng, "month", [("December", "January")],
                     [(m, MONTHS[(i + 1) % 12]) for i, m in enumerate(MONTHS)], "The month after {} is")
    docs += category(rng, "number", [("zero", "one")],
                     [(n, NUMBERS[i + 1]) for i, n in enumerate(NUMBERS[:-1])], "The number after {} is")
    docs += category(rng, "color", [("chalk", "white"), ("a ripe tomato", "red")],
                     COLORS, "The color of {} is")
    with open(HERE / "edge_mc.jsonl", "w") as f:
        for d in docs:
            f.write(json.dumps(d) + "\n")
    gen = []
    shots = "Q: What is the capital of Chile?\nA: Santiago\nQ: What is the capital of Nepal?\nA: Kathmandu\n"
    for country, city in CAPITALS[:20]:
        gen.append({"question": shots + f"Q: What is the capital of {country}?\nA:", "answer": city})
    with open(HERE / "edge_gen.jsonl", "w") as f:
        for d in gen:
            f.write(json.dumps(d) + "\n")
    print(f"{len(docs)} multiple-choice questions, {len(gen)} generation questions")


if __name__ == "__main__":
    main()
