"""The learning benchmark's task: general questions, a user's taste, a simulated user.

Traffic of a deployed assistant: one general question per session ("What is a glacier?"),
answered at the client's default temperature (1.0). The simulated user likes short,
complete answers: **at most 25 words, and the answer ended by itself** (finish reason
``stop``, not cut by the output limit). The packaged SmolLM2-135M-Instruct meets that in
0% of greedy answers and ~2.5% of sampled ones on the held-out subjects (it writes a
paragraph), while the same question with "Answer in one short sentence." appended is met
in ~90% of greedy answers: the preference is learnable, and words can say it.

The user (seeded, so a seed's traffic is the same in every variant):
- rates about half of the sessions with a thumb (``scale: binary``);
- in the ``comments`` variant, writes a short comment on some of its ratings: what it
  wanted ("Too long. Answer in one short sentence.") or what it liked;
- in the ``followups`` variant, answers some of the sessions it did not rate with a next
  message, as a user would: a correction or a complaint when the answer missed its taste,
  thanks when it met it.

Subjects are split: the held-out subjects (what the curve reports) are never asked in
training.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

MAX_WORDS = 25
MAX_TOKENS = 48  # the client's output limit: a paragraph is cut (finish reason "length")
TEMPERATURE = 1.0  # the OpenAI SDK's default
RATE_P = 0.5  # share of sessions the user rates
COMMENT_P = 0.5  # comments variant: share of ratings with a comment
FOLLOWUP_P = 0.5  # followups variant: share of unrated sessions the user answers
HELD_OUT = 40

TEMPLATES = (
    "What is {s}?",
    "Tell me about {s}.",
    "Can you explain {s}?",
    "Describe {s}.",
    "What do you know about {s}?",
)

SUBJECTS = """a volcano|a rainbow|honey|a magnet|a glacier|a comet|a violin|a bridge|a desert|
a coral reef|a tornado|a compass|a penguin|a telescope|bread|a vaccine|a battery|a cloud|
an earthquake|a lighthouse|a pyramid|a shark|tea|a mirror|a candle|a river delta|moss|
a satellite|an owl|chess|a bicycle|thunder|salt|an orchestra|bamboo|a submarine|
a jellyfish|a passport|a windmill|an eclipse|a piano|a camel|coffee|a rocket|a forest|
an island|a bee|a dolphin|a train|a castle|a clock|a map|a library|a hospital|a museum|
a spider|a tiger|an elephant|a giraffe|a whale|an octopus|a butterfly|a frog|a snake|
an eagle|a parrot|a horse|a cow|a sheep|a wolf|a fox|a bear|a lion|a zebra|a kangaroo|
a koala|a turtle|a crab|a lobster|a snail|an ant|a mosquito|a bat|a mouse|a rabbit|
a squirrel|a deer|a moose|a seal|a walrus|a pelican|a flamingo|a swan|a duck|a goose|
a chicken|an ostrich|a peacock|a hummingbird|a woodpecker|a crow|a pigeon|a sparrow|
cheese|butter|rice|pasta|chocolate|sugar|an apple|a banana|an orange|a lemon|a grape|
a strawberry|a potato|a tomato|a carrot|an onion|garlic|pepper|cinnamon|vanilla|soup|
a sandwich|pizza|sushi|a pancake|yogurt|milk|juice|water|ice|steam|fog|snow|hail|rain|
wind|a hurricane|a flood|a drought|lightning|a sunset|the moon|the sun|a star|a planet|
a galaxy|a black hole|gravity|an atom|a molecule|a cell|DNA|a gene|a protein|a virus|
bacteria|a fungus|a mushroom|a tree|a flower|grass|a cactus|a seed|a leaf|a root|
a mountain|a valley|a canyon|a cave|a waterfall|a lake|an ocean|a river|a beach|a swamp|
a meadow|a jungle|a farm|a village|a city|a harbor|an airport|a highway|a tunnel|a dam|
a skyscraper|a church|a school|a university|a bank|a market|a restaurant|a bakery|
a factory|a mine|a well|a garden|a park|a zoo|a stadium|a theater|a cinema|a camera|
a radio|a television|a phone|a computer|a keyboard|a printer|a robot|a drone|a car|
a bus|a truck|a ship|a canoe|a sailboat|a helicopter|an airplane|a balloon|a parachute|
a kite|a ladder|a hammer|a saw|a drill|a screw|a nail|a rope|a knot|a wheel|a lever|
a pulley|an engine|a motor|a pump|a valve|a pipe|a wire|a fuse|a switch|a lamp|
a light bulb|a laser|a lens|a prism|a microscope|a thermometer|a barometer|a scale|
a ruler|a pencil|a pen|paper|a book|a newspaper|a letter|a stamp|a coin|a wallet|
a key|a lock|a door|a window|a roof|a chimney|a fireplace|a stove|an oven|a fridge|
a kettle|a spoon|a fork|a knife|a plate|a cup|a bottle|a jar|a basket|a blanket|
a pillow|a bed|a chair|a table|a sofa|a carpet|a curtain|a towel|soap|a toothbrush|
a comb|a hat|a scarf|a glove|a shoe|a boot|a sock|a shirt|a coat|an umbrella|a tent|
a backpack|a guitar|a drum|a flute|a trumpet|a harp|a song|a poem|a painting|
a sculpture|a photograph|a dance|a game|a puzzle|a riddle|a joke|a dream|a holiday|
a birthday|a wedding|a festival|a parade|a marathon|a tennis match|football|basketball|
swimming|skiing|yoga|a garden hose|a snowman|a sandcastle|a bonfire|a fountain"""


@dataclass(frozen=True)
class Question:
    subject: str
    text: str


def subjects() -> list[str]:
    return [s.strip() for s in SUBJECTS.replace("\n", "").split("|") if s.strip()]


def split(seed: int) -> tuple[list[str], list[Question]]:
    """(training subjects, held-out questions): disjoint subjects. The held-out set is the
    same for every seed (seed 0's shuffle), so curves of different seeds compare."""
    names = subjects()
    random.Random(0).shuffle(names)
    held = names[:HELD_OUT]
    held_out = [Question(s, TEMPLATES[i % len(TEMPLATES)].format(s=s)) for i, s in enumerate(held)]
    return names[HELD_OUT:], held_out


def meets_taste(text: str | None, finish_reason: str | None) -> bool:
    """The user's taste: a complete answer of at most MAX_WORDS words."""
    words = (text or "").split()
    return finish_reason == "stop" and 0 < len(words) <= MAX_WORDS


COMMENTS_DOWN = (
    "Too long. Answer in one short sentence.",
    "Please keep it to one short sentence.",
    "I wanted a short answer: one sentence.",
)
COMMENTS_UP = (
    "Good: short and to the point.",
    "Nice, one short sentence is what I want.",
)
FOLLOWUPS_DOWN = (
    "No, that's too long. Just answer in one short sentence.",
    "That's not what I asked for. One short sentence, please.",
    "Too long and rambling. Keep it to one sentence.",
)
FOLLOWUPS_UP = ("Thanks, that's perfect.", "Great, thanks!")


@dataclass
class Reaction:
    """What the simulated user does after one answer."""

    thumb: bool | None = None  # None: no rating
    comment: str | None = None
    followup: str | None = None


class SimulatedUser:
    """Seeded: the same seed decides the same things in every variant (which sessions are
    rated, which ratings get a comment, which unrated sessions get a follow-up), so the
    variants differ only in what the user is allowed to say."""

    def __init__(self, seed: int, variant: str, train_subjects: list[str]) -> None:
        self.rng = random.Random(seed)
        self.variant = variant
        self.train = train_subjects

    def question(self) -> Question:
        s = self.rng.choice(self.train)
        return Question(s, self.rng.choice(TEMPLATES).format(s=s))

    def react(self, text: str | None, finish_reason: str | None) -> Reaction:
        liked = meets_taste(text, finish_reason)
        rated, comment_draw, followup_draw = (self.rng.random() for _ in range(3))
        pick = self.rng.randrange(1_000_000)
        if rated < RATE_P:
            comment = None
            if self.variant == "comments" and comment_draw < COMMENT_P:
                options = COMMENTS_UP if liked else COMMENTS_DOWN
                comment = options[pick % len(options)]
            return Reaction(thumb=liked, comment=comment)
        if self.variant == "followups" and followup_draw < FOLLOWUP_P:
            options = FOLLOWUPS_UP if liked else FOLLOWUPS_DOWN
            return Reaction(followup=options[pick % len(options)])
        return Reaction()
