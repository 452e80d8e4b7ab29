"""A knowledge-update set: conversations in which facts change, so that what the Memory Manager does
with a change decides the answer. Synthetic, generated reproducibly from a seed.

Each conversation is two people talking over five sessions, two weeks apart. Each person has a few
*threads*, one per template family: a fact told in an early session that later is

- replaced (category 1, "replaced"): a new city, job, car, meeting day... (the Manager should UPDATE
  the old memory, or DELETE it and ADD the new);
- cancelled (category 2, "cancelled"): a trip called off, a club quit (DELETE); the question asks
  whether it still holds ("No");
- accumulated (category 3, "accumulated"): a second dog, another language (UPDATE merges); the answer
  names both;
- or left as it was (category 4, "unchanged"), sometimes restated ("I still live in Oslo": NONE), where
  a Manager that deletes too eagerly loses the answer;
- dropped (category 6, "dropped": LoCoMo's loader reads 5 as adversarial; only in a set that asks for
  the kind, `kinds`): one of two things held at once ends (two charities given to, one stopped); the
  answer names the one left. Here DELETE is what pays: with the ended memory removed, the other is what
  retrieval finds, where ADD keeps both; a cancelled question's "No" was right from any bank.

Unrelated chatter (a meal, the weather) is told between them and never asked about. Questions ask for
the current state. The file is LoCoMo's format (`session_N`, `session_N_date_time`, `observation`
facts with their dia_ids, `qa` with evidence and category), so the LoCoMo loader, the banks, both
agents, the metrics and `memr1 compare` run on it unchanged; `SPEC` names its categories as above.

Splits are by template family and by entity: every family (its phrasings, question and values), person
name and chatter line belongs to one split, so no test template or name is seen in training. Sample ids are
`ku-{split}-{NN}`; `memr1/conf/data/knowledge_update.yaml` lists them.

`generate(kinds=...)` picks the kinds of change; the default, `DEFAULT_KINDS`, is the set of record
(`data=knowledge_update`: every knowledge-update row so far), whose bytes a kind added later leaves
unchanged; `data=knowledge_update_dropped` adds the dropped kind.

Limits: synthetic English from templates, one fact per turn, no turns that are not facts (LoCoMo's
small talk), changes stated explicitly ("I moved to ..."), two values per accumulation, dates that
are the sessions'. It tests whether a Manager keeps memory current, not conversational understanding.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from memr1.datasets.locomo import load_locomo
from memr1.datasets.registry import DatasetSpec

SPLITS = ("train", "validation", "test")
CONVERSATIONS = {"train": 40, "validation": 20, "test": 32}  # questions: 640, 120, 320
SESSIONS = 5
CATEGORY_NAMES = {1: "replaced", 2: "cancelled", 3: "accumulated", 4: "unchanged", 6: "dropped"}
REPLACED, CANCELLED, ACCUMULATED, UNCHANGED, DROPPED = 1, 2, 3, 4, 6  # 5 is LoCoMo's adversarial
# The kinds of change, each the category of its changed threads (an unchanged thread is UNCHANGED).
_CATEGORY_OF_KIND = {name: category for category, name in CATEGORY_NAMES.items() if category != UNCHANGED}
KINDS = tuple(_CATEGORY_OF_KIND)
DEFAULT_KINDS = ("replaced", "cancelled", "accumulated")  # the set of record (data=knowledge_update)


@dataclass(frozen=True)
class Family:
    """One kind of fact and how it is told, changed and asked about. `{name}` is the speaker in the
    third person, `{value}` the first value, `{new}` the value after the change.

    kind: one of `KINDS`; split: the one split whose conversations use it (so its values, phrasings and
    question belong to that split alone); values: where values come from. A dropped family tells a
    second thing held beside the first (`also`, `also_fact`: `{new}`), and its change ends the first."""

    name: str
    kind: str
    split: str
    values: tuple[str, ...]
    told: str  # the speaker's turn
    fact: str  # its observation, in the third person
    changed: str
    changed_fact: str
    restated: str
    restated_fact: str
    question: str
    answer: str = "{new}"  # the current state after a change; unchanged: `unchanged_answer`
    unchanged_answer: str = "{value}"
    also: str = ""
    also_fact: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"family {self.name}: kind {self.kind!r}; expected one of {KINDS}")
        if (self.kind == "dropped") != bool(self.also and self.also_fact):
            raise ValueError(f"family {self.name}: `also` and `also_fact` are told by a dropped family, and only by one")


_CITIES = ("Oslo", "Lisbon", "Denver", "Kyoto", "Nairobi", "Montreal", "Tallinn", "Porto", "Austin", "Hobart",
           "Seville", "Quito", "Gdansk", "Leeds", "Perth", "Cusco", "Bergen", "Malmo", "Dakar", "Tucson", "Lyon")
_JOBS = ("nurse", "carpenter", "pharmacist", "translator", "architect", "welder", "librarian", "pilot",
         "paramedic", "baker", "surveyor", "florist", "plumber", "chemist", "tailor", "journalist", "dentist", "gardener")
_CARS = ("Honda Civic", "Ford Focus", "Toyota Prius", "Mazda 3", "Subaru Outback", "Kia Soul", "Volvo V60",
         "Nissan Leaf", "Jeep Wrangler", "Tesla Model 3", "Fiat 500", "Skoda Octavia", "Mini Cooper", "Audi A4", "Hyundai Kona")
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_BANDS = ("Radiohead", "Arctic Monkeys", "ABBA", "Coldplay", "Metallica", "Daft Punk", "Fleetwood Mac", "Queen",
          "The Strokes", "Muse", "Bon Iver", "Pixies", "Blur", "Tame Impala", "Wilco", "Portishead", "Oasis", "Pearl Jam")
_SPORTS = ("tennis", "rowing", "climbing", "fencing", "judo", "squash", "cycling", "archery", "volleyball",
           "badminton", "karate", "surfing", "skiing", "golf", "handball")
_PHONES = ("iPhone", "Pixel", "Galaxy", "Fairphone", "Moto G", "Xperia", "OnePlus", "Nokia")
_DRINKS = ("black coffee", "green tea", "oat latte", "espresso", "chai", "mate", "cocoa", "rooibos", "flat white", "matcha")
_PLACES = ("Iceland", "Peru", "Japan", "Morocco", "Norway", "Vietnam", "Chile", "Greece", "Canada", "Kenya",
           "Portugal", "Scotland", "Mexico", "Nepal", "Croatia", "Jordan")
_CLUBS = ("chess club", "choir", "running club", "pottery class", "debate society", "hiking group", "book club",
          "jazz band", "rowing crew", "film society", "knitting circle", "salsa class")
_MAGAZINES = ("The Economist", "National Geographic", "Wired", "The New Yorker", "Vogue", "Nature", "Time",
              "Rolling Stone", "Harper's", "Scientific American")
_COURSES = ("Spanish", "photography", "calculus", "woodworking", "coding", "cooking", "sign language",
            "first aid", "drawing", "accounting", "astronomy", "poetry")
_DOGS = ("Buddy", "Scout", "Luna", "Max", "Biscuit", "Pepper", "Rocky", "Milo", "Daisy", "Ziggy", "Juno", "Olive",
         "Rex", "Maple", "Bruno", "Nala", "Otis", "Hazel", "Kobe", "Poppy", "Toby", "Willow")
_LANGUAGES = ("French", "German", "Italian", "Japanese", "Korean", "Arabic", "Swahili", "Dutch", "Polish",
              "Greek", "Turkish", "Hindi", "Finnish", "Czech", "Hebrew")
_INSTRUMENTS = ("guitar", "piano", "violin", "cello", "drums", "flute", "trumpet", "banjo", "harp", "ukulele",
                "saxophone", "clarinet")
_CAUSES = ("food bank", "animal shelter", "public library", "children's hospital", "community garden",
           "soup kitchen", "literacy program", "beach cleanup", "youth center", "city museum")
_SERVICES = ("Netflix", "Hulu", "Disney+", "HBO Max", "Apple TV", "Paramount+", "Peacock", "Crunchyroll", "Mubi", "Tidal")
_WORKOUTS = ("yoga", "pilates", "spin", "zumba", "boxing", "aerobics", "barre", "kickboxing", "aqua fit", "circuit")
_CHARITIES = ("Oxfam", "UNICEF", "Red Cross", "WWF", "Greenpeace", "Amnesty International", "Save the Children",
              "Habitat for Humanity", "CARE", "Direct Relief")
_PLANTS = ("basil", "tomatoes", "roses", "tulips", "mint", "peppers", "lavender", "ferns", "orchids", "sunflowers",
           "strawberries", "cacti")

FAMILIES: tuple[Family, ...] = (
    # replaced
    Family("home", "replaced", "train", _CITIES, "I live in {value} these days.", "{name} lives in {value}.",
           "Big news: I moved to {new} last week!", "{name} moved from {value} to {new}.",
           "Still loving life in {value}.", "{name} still lives in {value}.", "Which city does {name} live in now?"),
    Family("job", "replaced", "train", _JOBS, "I work as a {value}.", "{name} works as a {value}.",
           "I quit being a {value}; I'm a {new} now.", "{name} changed jobs from {value} to {new}.",
           "Work as a {value} keeps me busy.", "{name} still works as a {value}.", "What is {name}'s job now?"),
    Family("car", "replaced", "train", _CARS, "I drive a {value}.", "{name} drives a {value}.",
           "I sold my {value} and bought a {new}.", "{name} replaced the {value} with a {new}.",
           "My {value} is still running fine.", "{name} still drives the {value}.", "What car does {name} drive now?"),
    Family("club_day", "replaced", "train", _DAYS, "My book club meets every {value}.", "{name}'s book club meets on {value}s.",
           "Our book club moved its meetings to {new}s.", "{name}'s book club now meets on {new}s instead of {value}s.",
           "Book club on {value} again, as always.", "{name}'s book club still meets on {value}s.",
           "On which day does {name}'s book club meet now?"),
    Family("band", "replaced", "validation", _BANDS, "My favorite band is {value}.", "{name}'s favorite band is {value}.",
           "These days my favorite band is {new}, not {value}.", "{name}'s favorite band is now {new}.",
           "I still can't stop playing {value}.", "{name} still loves {value} most.", "What is {name}'s favorite band now?"),
    Family("sport", "replaced", "test", _SPORTS, "I do {value} twice a week.", "{name} does {value} twice a week.",
           "I gave up {value} and took up {new} instead.", "{name} switched from {value} to {new}.",
           "Another {value} session this weekend.", "{name} still does {value}.", "Which sport does {name} do now?"),
    Family("phone", "replaced", "test", _PHONES, "I use a {value} phone.", "{name} uses a {value} phone.",
           "My old {value} died, so I got a {new}.", "{name} replaced the {value} phone with a {new}.",
           "My {value} battery still lasts all day.", "{name} still uses the {value} phone.", "What phone does {name} use now?"),
    Family("drink", "replaced", "test", _DRINKS, "Every morning I drink {value}.", "{name} drinks {value} every morning.",
           "I switched my morning {value} for {new}.", "{name} now drinks {new} in the morning instead of {value}.",
           "Started today with {value}, as usual.", "{name} still drinks {value} every morning.",
           "What does {name} drink in the morning now?"),
    # cancelled
    Family("trip", "cancelled", "train", _PLACES, "I'm planning a trip to {value} this summer.", "{name} plans a trip to {value}.",
           "I had to cancel my trip to {value}.", "{name} cancelled the trip to {value}.",
           "Still counting the days until {value}!", "{name} still plans the trip to {value}.",
           "Is {name} still planning a trip to {value}?", answer="No", unchanged_answer="Yes"),
    Family("club", "cancelled", "train", _CLUBS, "I joined the {value}.", "{name} is a member of the {value}.",
           "I quit the {value}.", "{name} left the {value}.",
           "Had a great evening at the {value}.", "{name} is still in the {value}.",
           "Is {name} still a member of the {value}?", answer="No", unchanged_answer="Yes"),
    Family("magazine", "cancelled", "validation", _MAGAZINES, "I subscribed to {value}.", "{name} subscribes to {value}.",
           "I cancelled my {value} subscription.", "{name} cancelled the subscription to {value}.",
           "The new issue of {value} just arrived.", "{name} still subscribes to {value}.",
           "Does {name} still subscribe to {value}?", answer="No", unchanged_answer="Yes"),
    Family("course", "cancelled", "test", _COURSES, "I signed up for a {value} course.", "{name} takes a {value} course.",
           "I dropped out of my {value} course.", "{name} dropped the {value} course.",
           "My {value} course is going well.", "{name} is still taking the {value} course.",
           "Is {name} still taking a {value} course?", answer="No", unchanged_answer="Yes"),
    # accumulated
    Family("dogs", "accumulated", "train", _DOGS, "I adopted a dog named {value}.", "{name} has a dog named {value}.",
           "We adopted another dog, {new}!", "{name} adopted a second dog, {new}, besides {value}.",
           "{value} loves the park.", "{name}'s dog {value} loves the park.",
           "What are the names of {name}'s dogs?", answer="{value} and {new}", unchanged_answer="{value}"),
    Family("languages", "accumulated", "train", _LANGUAGES, "I speak {value}.", "{name} speaks {value}.",
           "I've also learned {new} now.", "{name} learned {new} and also speaks {value}.",
           "I practised my {value} today.", "{name} still practises {value}.",
           "Which languages does {name} speak?", answer="{value} and {new}", unchanged_answer="{value}"),
    Family("instruments", "accumulated", "validation", _INSTRUMENTS, "I play the {value}.", "{name} plays the {value}.",
           "I started learning the {new} too.", "{name} plays the {value} and now also the {new}.",
           "Practised the {value} for an hour.", "{name} still practises the {value}.",
           "Which instruments does {name} play?", answer="{value} and {new}", unchanged_answer="{value}"),
    Family("garden", "accumulated", "test", _PLANTS, "I grow {value} on my balcony.", "{name} grows {value} on the balcony.",
           "I planted {new} next to my {value}.", "{name} grows {new} as well as {value}.",
           "The {value} are thriving.", "{name}'s {value} are thriving.",
           "What does {name} grow on the balcony?", answer="{value} and {new}", unchanged_answer="{value}"),
    # dropped (DEFAULT_KINDS leaves them out)
    Family("volunteering", "dropped", "train", _CAUSES, "I started volunteering at the {value}.", "{name} volunteers at the {value}.",
           "I stopped volunteering at the {value}.", "{name} stopped volunteering at the {value}.",
           "Another shift at the {value} today.", "{name} still volunteers at the {value}.",
           "Where does {name} volunteer now?", answer="{new}", unchanged_answer="{value} and {new}",
           also="I'm volunteering at the {new} too now.", also_fact="{name} also volunteers at the {new}."),
    Family("streaming", "dropped", "train", _SERVICES, "I pay for {value} every month.", "{name} pays for {value}.",
           "I stopped paying for {value}; I never watched it.", "{name} stopped paying for {value}.",
           "Watched a whole series on {value} this weekend.", "{name} still pays for {value}.",
           "Which streaming services does {name} pay for now?", answer="{new}", unchanged_answer="{value} and {new}",
           also="I signed up for {new} as well.", also_fact="{name} also pays for {new}."),
    Family("workouts", "dropped", "validation", _WORKOUTS, "I go to a {value} class at the gym.", "{name} goes to a {value} class.",
           "I don't go to {value} class any more.", "{name} stopped going to the {value} class.",
           "{value} class was tough today.", "{name} still goes to the {value} class.",
           "Which gym classes does {name} go to now?", answer="{new}", unchanged_answer="{value} and {new}",
           also="I added a {new} class to my week.", also_fact="{name} also goes to a {new} class."),
    Family("charities", "dropped", "test", _CHARITIES, "I give to {value} every month.", "{name} donates to {value} monthly.",
           "I stopped my donations to {value}.", "{name} stopped donating to {value}.",
           "Sent this month's donation to {value}.", "{name} still donates to {value}.",
           "Which charities does {name} donate to now?", answer="{new}", unchanged_answer="{value} and {new}",
           also="I set up a monthly gift to {new} as well.", also_fact="{name} also donates to {new} monthly."),
)

_NAMES = ("Ana", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kira", "Leo", "Mara", "Nico",
          "Omar", "Pia", "Quinn", "Rosa", "Sami", "Tara", "Uma", "Vik", "Wren", "Xia", "Yara", "Zed", "Abel",
          "Bea", "Cruz", "Dina", "Ezra", "Fern", "Gil", "Hugo", "Ines", "Jade", "Kai", "Lena", "Milo", "Nell",
          "Otto", "Pax", "Remy", "Sage", "Theo", "Una", "Vera", "Wade", "Yuri", "Zoe", "Arlo", "Bryn", "Cyra",
          "Dex", "Edda", "Finn", "Greta", "Hal", "Isla", "Joss", "Kemal", "Lior", "Mina", "Noor")
_CHATTER = (
    ("I had sushi for dinner yesterday.", "{name} had sushi for dinner."),
    ("It rained all weekend here.", "It rained all weekend where {name} lives."),
    ("I finally fixed the leaky tap.", "{name} fixed a leaky tap."),
    ("I watched a documentary about whales.", "{name} watched a documentary about whales."),
    ("My neighbour lent me a ladder.", "{name}'s neighbour lent {name} a ladder."),
    ("I baked banana bread on Sunday.", "{name} baked banana bread."),
    ("I found a great podcast about history.", "{name} found a history podcast."),
    ("I repainted the kitchen blue.", "{name} repainted the kitchen blue."),
    ("I got a flu shot this week.", "{name} got a flu shot."),
    ("I lost my umbrella on the bus.", "{name} lost an umbrella on the bus."),
    ("I cleaned out the garage.", "{name} cleaned out the garage."),
    ("I tried a new pizza place downtown.", "{name} tried a new pizza place."),
    ("I read a thriller in one sitting.", "{name} read a thriller in one sitting."),
    ("I bought a new desk lamp.", "{name} bought a desk lamp."),
    ("I visited my grandmother on Saturday.", "{name} visited a grandmother."),
)
_SPLIT_SHARES = {"train": 0.5, "validation": 0.2, "test": 0.3}  # of the names and the chatter


def split_pool(pool: Sequence[str], seed: int) -> dict[str, tuple[str, ...]]:
    """`pool` cut into three disjoint parts, one per split, after a seeded shuffle."""
    shuffled = list(pool)
    random.Random(f"{seed}:{len(pool)}:{pool[0]}").shuffle(shuffled)
    train = round(len(shuffled) * _SPLIT_SHARES["train"])
    validation = train + round(len(shuffled) * _SPLIT_SHARES["validation"])
    return {"train": tuple(shuffled[:train]), "validation": tuple(shuffled[train:validation]), "test": tuple(shuffled[validation:])}


@dataclass
class _Session:
    turns: list[dict[str, str]]
    facts: dict[str, list[list[str]]]


def generate(
    seed: int = 0, conversations: Mapping[str, int] | None = None, kinds: Sequence[str] = DEFAULT_KINDS
) -> list[dict[str, Any]]:
    """The set as LoCoMo samples, `conversations[split]` of each split (default `CONVERSATIONS`), with
    the families of `kinds` (each person one thread per family of the split)."""
    counts = dict(CONVERSATIONS if conversations is None else conversations)
    unknown = set(counts) - set(SPLITS)
    if unknown:
        raise ValueError(f"conversations: unknown splits {sorted(unknown)}; expected some of {SPLITS}")
    unknown = set(kinds) - set(KINDS)
    if unknown or not kinds:
        raise ValueError(f"kinds: {sorted(unknown) or 'none'}; expected some of {KINDS}")
    names = split_pool(_NAMES, seed)
    chatter = split_pool([str(index) for index in range(len(_CHATTER))], seed)
    samples = []
    for split in SPLITS:
        families = [family for family in FAMILIES if family.split == split and family.kind in kinds]
        for number in range(counts.get(split, 0)):
            rng = random.Random(f"{seed}:{split}:{number}")
            speakers = rng.sample(names[split], 2)
            lines = [_CHATTER[int(index)] for index in chatter[split]]
            samples.append(_conversation(f"ku-{split}-{number:02d}", speakers, families, lines, rng))
    return samples


def _conversation(
    sample_id: str,
    speakers: Sequence[str],
    families: Sequence[Family],
    chatter: Sequence[tuple[str, str]],
    rng: random.Random,
) -> dict[str, Any]:
    start = date(2023, 1, 2) + timedelta(days=rng.randrange(0, 300))
    sessions = [_Session([], {speaker: [] for speaker in speakers}) for _ in range(SESSIONS)]

    def say(session: int, speaker: str, text: str, fact: str) -> str:
        turns = sessions[session].turns
        dia_id = f"D{session + 1}:{len(turns) + 1}"
        turns.append({"speaker": speaker, "dia_id": dia_id, "text": text})
        sessions[session].facts[speaker].append([fact, dia_id])
        return dia_id

    qa = []
    for speaker in speakers:
        for family in families:
            value, new = rng.sample(family.values, 2)
            fields = {"name": speaker, "value": value, "new": new}
            told_in = rng.randrange(0, 2)
            changed = rng.random() < 0.7
            told = [say(told_in, speaker, family.told.format(**fields), family.fact.format(**fields))]
            if family.kind == "dropped":  # the second thing held, told before either can end
                told_in = rng.randrange(told_in + 1, SESSIONS - 1)
                told.append(say(told_in, speaker, family.also.format(**fields), family.also_fact.format(**fields)))
            if changed:
                changed_in = rng.randrange(told_in + 1, SESSIONS)
                change = say(changed_in, speaker, family.changed.format(**fields), family.changed_fact.format(**fields))
                # What the answer rests on: both values (accumulated), the one left and the end of the
                # other (dropped), the change alone (replaced, cancelled).
                evidence = {"accumulated": told + [change], "dropped": told[1:] + [change]}.get(family.kind, [change])
                category, answer = _CATEGORY_OF_KIND[family.kind], family.answer.format(**fields)
            else:
                evidence = told
                category, answer = UNCHANGED, family.unchanged_answer.format(**fields)
                if rng.random() < 0.5:  # told again, unchanged: nothing for the Manager to write
                    restated_in = rng.randrange(told_in + 1, SESSIONS)
                    say(restated_in, speaker, family.restated.format(**fields), family.restated_fact.format(**fields))
            qa.append({"question": family.question.format(**fields), "answer": answer, "evidence": evidence, "category": category})
        for text, fact in rng.sample(list(chatter), min(2, len(chatter))):
            say(rng.randrange(SESSIONS), speaker, text, fact.format(name=speaker))

    conversation: dict[str, Any] = {"speaker_a": speakers[0], "speaker_b": speakers[1]}
    observation: dict[str, Any] = {}
    for index, session in enumerate(sessions, start=1):
        when = start + timedelta(weeks=2 * (index - 1))
        conversation[f"session_{index}_date_time"] = f"10:00 am on {when.day} {when:%B}, {when.year}"
        conversation[f"session_{index}"] = session.turns
        observation[f"session_{index}_observation"] = session.facts
    return {"sample_id": sample_id, "conversation": conversation, "observation": observation, "qa": qa}


def write(
    path: str | Path, seed: int = 0, conversations: Mapping[str, int] | None = None, kinds: Sequence[str] = DEFAULT_KINDS
) -> dict[str, list[str]]:
    """Write the set to `path` (LoCoMo JSON); returns the sample ids of each split."""
    samples = generate(seed, conversations, kinds)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(samples, indent=1))
    return {split: [s["sample_id"] for s in samples if s["sample_id"].startswith(f"ku-{split}-")] for split in SPLITS}


SPEC = DatasetSpec(
    title="the knowledge-update set",
    load=load_locomo,
    categories=CATEGORY_NAMES,
    categories_source="memr1's generator (memr1/datasets/knowledge_update.py)",
    locomo_format=True,
    missing_file="Write it with `memr1 knowledge-update` (seed 0): the exact command is in the comment of the data config "
    "that names this path (memr1/conf/data/knowledge_update*.yaml).",
)
