"""Sentences in several languages, composed from our own word lists (no corpus text).

English comes from :func:`sleuthd_bench.synth.sentences`; German, French, Spanish and Italian from small
templates below. ``short=True`` gives 4-7 word sentences (about 1.5-2.5 s spoken), for short turns.
"""

from __future__ import annotations

import random

from sleuthd_bench import synth

LANGUAGES = ("en", "de", "fr", "es", "it")
# espeak-ng's name for each language (its voices are `<lang>+<variant>`).
ESPEAK_LANG = {"en": "en-us", "de": "de", "fr": "fr-fr", "es": "es", "it": "it"}
# Kokoro's phonemizer (espeak-ng through kokoro-onnx) takes the same names.
KOKORO_LANG = ESPEAK_LANG

_WORDS: dict[str, dict[str, tuple[str, ...]]] = {
    "de": {
        "subj": (
            "der junge Arzt",
            "meine Nachbarin",
            "ein müder Student",
            "der alte Tischler",
            "unser neuer Chef",
            "die Busfahrerin",
            "mein kleiner Bruder",
            "eine stille Ingenieurin",
            "der Hotelkoch",
            "dein Onkel",
        ),
        "verb": (
            "gefunden",
            "verkauft",
            "repariert",
            "gemalt",
            "getragen",
            "bestellt",
            "geöffnet",
            "versteckt",
            "geputzt",
            "gemessen",
        ),
        "obj": (
            "das rote Fahrrad",
            "die kaputte Lampe",
            "drei Kisten",
            "eine alte Karte",
            "den silbernen Kessel",
            "einen Korb mit Äpfeln",
            "den Holzstuhl",
            "zwei schwere Koffer",
            "den blauen Schirm",
            "das Gartentor",
        ),
        "place": (
            "am Hafen",
            "hinter dem Bahnhof",
            "im kleinen Garten",
            "an der Ecke",
            "neben der Bibliothek",
            "im obersten Stock",
            "vor der Bäckerei",
            "am Fluss",
            "unter der alten Brücke",
            "auf dem Markt",
        ),
        "time": (
            "Heute früh",
            "Letzten Freitag",
            "Nach dem Treffen",
            "Vor dem Mittagessen",
            "Am Sonntagabend",
            "Gestern Nachmittag",
            "Während des Sturms",
            "Spät in der Nacht",
            "Vor einer Woche",
            "Im Frühling",
        ),
    },
    "fr": {
        "subj": (
            "le jeune médecin",
            "ma voisine",
            "un étudiant fatigué",
            "le vieux menuisier",
            "notre nouveau chef",
            "la conductrice du bus",
            "mon petit frère",
            "une ingénieure discrète",
            "le cuisinier",
            "ton oncle",
        ),
        "verb": ("trouvé", "vendu", "réparé", "peint", "porté", "commandé", "ouvert", "caché", "nettoyé", "mesuré"),
        "obj": (
            "le vélo rouge",
            "la lampe cassée",
            "trois boîtes",
            "une vieille carte",
            "la bouilloire en argent",
            "un panier de pommes",
            "la chaise en bois",
            "deux lourdes valises",
            "le parapluie bleu",
            "la porte du jardin",
        ),
        "place": (
            "près du port",
            "derrière la gare",
            "dans le petit jardin",
            "au coin de la rue",
            "à côté de la bibliothèque",
            "au dernier étage",
            "devant la boulangerie",
            "au bord de la rivière",
            "sous le vieux pont",
            "sur la place du marché",
        ),
        "time": (
            "Ce matin",
            "Vendredi dernier",
            "Après la réunion",
            "Avant le déjeuner",
            "Dimanche soir",
            "Hier après-midi",
            "Pendant la tempête",
            "Tard hier soir",
            "Il y a une semaine",
            "Au printemps",
        ),
    },
    "es": {
        "subj": (
            "el joven médico",
            "mi vecina",
            "un estudiante cansado",
            "el viejo carpintero",
            "nuestro nuevo jefe",
            "la conductora del autobús",
            "mi hermano pequeño",
            "una ingeniera tranquila",
            "el cocinero",
            "tu tío",
        ),
        "verb": ("encontró", "vendió", "reparó", "pintó", "llevó", "pidió", "abrió", "escondió", "limpió", "midió"),
        "obj": (
            "la bicicleta roja",
            "la lámpara rota",
            "tres cajas",
            "un mapa antiguo",
            "la tetera de plata",
            "una cesta de manzanas",
            "la silla de madera",
            "dos maletas pesadas",
            "el paraguas azul",
            "la puerta del jardín",
        ),
        "place": (
            "cerca del puerto",
            "detrás de la estación",
            "en el pequeño jardín",
            "en la esquina",
            "junto a la biblioteca",
            "en el último piso",
            "delante de la panadería",
            "junto al río",
            "bajo el puente viejo",
            "en la plaza del mercado",
        ),
        "time": (
            "Esta mañana",
            "El viernes pasado",
            "Después de la reunión",
            "Antes del almuerzo",
            "El domingo por la tarde",
            "Ayer por la tarde",
            "Durante la tormenta",
            "Anoche",
            "Hace una semana",
            "En primavera",
        ),
    },
    "it": {
        "subj": (
            "il giovane medico",
            "la mia vicina",
            "uno studente stanco",
            "il vecchio falegname",
            "il nostro nuovo capo",
            "l'autista del bus",
            "mio fratello minore",
            "un'ingegnera tranquilla",
            "il cuoco dell'albergo",
            "tuo zio",
        ),
        "verb": (
            "trovato",
            "venduto",
            "riparato",
            "dipinto",
            "portato",
            "ordinato",
            "aperto",
            "nascosto",
            "pulito",
            "misurato",
        ),
        "obj": (
            "la bicicletta rossa",
            "la lampada rotta",
            "tre scatole",
            "una vecchia mappa",
            "il bollitore d'argento",
            "un cesto di mele",
            "la sedia di legno",
            "due valigie pesanti",
            "l'ombrello blu",
            "il cancello del giardino",
        ),
        "place": (
            "vicino al porto",
            "dietro la stazione",
            "nel piccolo giardino",
            "all'angolo",
            "accanto alla biblioteca",
            "all'ultimo piano",
            "davanti al panificio",
            "lungo il fiume",
            "sotto il vecchio ponte",
            "in piazza del mercato",
        ),
        "time": (
            "Stamattina",
            "Venerdì scorso",
            "Dopo la riunione",
            "Prima di pranzo",
            "Domenica sera",
            "Ieri pomeriggio",
            "Durante il temporale",
            "Ieri notte",
            "Una settimana fa",
            "In primavera",
        ),
    },
}


def _compose(lang: str, rng: random.Random, short: bool) -> str:
    w = _WORDS[lang]
    subj, verb, obj = rng.choice(w["subj"]), rng.choice(w["verb"]), rng.choice(w["obj"])
    place, when = rng.choice(w["place"]), rng.choice(w["time"])
    cap = subj[0].upper() + subj[1:]
    if lang == "de":
        return f"{cap} hat {obj} {verb}." if short else f"{when} hat {subj} {obj} {place} {verb}."
    if lang == "fr":
        return f"{cap} a {verb} {obj}." if short else f"{when}, {subj} a {verb} {obj} {place}."
    if lang == "es":
        return f"{cap} {verb} {obj}." if short else f"{when}, {subj} {verb} {obj} {place}."
    return f"{cap} ha {verb} {obj}." if short else f"{when}, {subj} ha {verb} {obj} {place}."


def sentences(lang: str, n: int, seed: int, *, short: bool = False) -> list[str]:
    """``n`` distinct sentences in ``lang`` (one of LANGUAGES), deterministic in ``seed``."""
    if lang not in LANGUAGES:
        raise ValueError(f"unknown language {lang!r}; choose from {', '.join(LANGUAGES)}")
    if lang == "en" and not short:
        return synth.sentences(n, seed)
    rng = random.Random(seed)
    out: list[str] = []
    seen: set[str] = set()
    for _ in range(n * 200):
        if len(out) == n:
            break
        if lang == "en":
            words = synth.sentences(1, rng.getrandbits(32))[0].rstrip(".?").split()
            s = " ".join(words[: rng.randint(4, 7)]) + "."
        else:
            s = _compose(lang, rng, short)
        if s not in seen:
            seen.add(s)
            out.append(s)
    if len(out) < n:
        raise ValueError(f"only {len(out)} distinct {lang} sentences for seed {seed}; ask for fewer")
    return out
