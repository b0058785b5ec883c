"""The document collection of the `search` environment: short facts about an invented country, so
the answers cannot come from what a model learned in pretraining, only from searching. Each
document carries the question it answers and the short answer, which appears in its text.
A Python module rather than a data file, so it is packaged with the code like any module.
"""

from __future__ import annotations

from typing import NamedTuple


class Document(NamedTuple):
    title: str
    text: str
    question: str
    answer: str


DOCUMENTS: tuple[Document, ...] = (
    Document(
        "Marrowick Lighthouse",
        "The lighthouse of the port town of Marrowick is built of blue glass bricks and was finished in 1822.",
        "In what year was the Marrowick lighthouse finished?",
        "1822",
    ),
    Document(
        "Velt River",
        "The Velt River runs 340 kilometres from the Orran Hills to the Grey Sea.",
        "How many kilometres long is the Velt River?",
        "340",
    ),
    Document(
        "Tamsin Okoro",
        "Tamsin Okoro invented the folding bicycle bell while working as a clockmaker in Lisle.",
        "What was the job of Tamsin Okoro?",
        "clockmaker",
    ),
    Document(
        "Glimmerfish",
        "The glimmerfish lives in cold mountain lakes and glows green at night.",
        "What color does the glimmerfish glow?",
        "green",
    ),
    Document(
        "Osso",
        "Osso is the fourth planet of the star Kepra and has 2 moons, Ril and Tann.",
        "How many moons does the planet Osso have?",
        "2",
    ),
    Document(
        "Brannock Cheese",
        "Brannock cheese is made from goat milk and aged in caves for 9 months.",
        "From the milk of which animal is Brannock cheese made?",
        "goat",
    ),
    Document(
        "Lantern Festival",
        "The town of Quell holds its Lantern Festival every year in October.",
        "In which month is the Lantern Festival of Quell held?",
        "October",
    ),
    Document(
        "Mount Halder",
        "Mount Halder is 4210 metres tall and was first climbed by Ines Varga.",
        "Who first climbed Mount Halder?",
        "Ines Varga",
    ),
    Document(
        "Sorrel Academy",
        "The Sorrel Academy of Music was founded by the violinist Petra Lind in 1901.",
        "Who founded the Sorrel Academy of Music?",
        "Petra Lind",
    ),
    Document(
        "Dunmere Bridge",
        "The Dunmere Bridge crosses the Fenn Canal and is made entirely of oak.",
        "Of which wood is the Dunmere Bridge made?",
        "oak",
    ),
    Document(
        "Zephyr Moth",
        "The zephyr moth has orange wings and feeds only on thistle flowers.",
        "On which flowers does the zephyr moth feed?",
        "thistle",
    ),
    Document(
        "Coralia",
        "Coralia is an island nation south of Varland whose capital is Port Amber.",
        "What is the capital of Coralia?",
        "Port Amber",
    ),
    Document(
        "Kettleby Clock Tower",
        "The clock tower of Kettleby has 4 faces and rings its bell at noon.",
        "How many faces does the Kettleby clock tower have?",
        "4",
    ),
    Document(
        "Orla Finch",
        "Orla Finch wrote the novel The Salt Road, which won the Harrow Prize.",
        "Which novel did Orla Finch write?",
        "The Salt Road",
    ),
    Document(
        "Pinevale Railway",
        "The Pinevale Railway opened in 1888 and carried timber to the coast.",
        "What did the Pinevale Railway carry?",
        "timber",
    ),
    Document(
        "Lake Serin",
        "Lake Serin is the deepest lake in Varland, reaching 610 metres.",
        "How many metres deep is Lake Serin?",
        "610",
    ),
    Document(
        "Ambrose Tull",
        "The painter Ambrose Tull is known for painting nothing but foxes.",
        "Which animal did the painter Ambrose Tull paint?",
        "foxes",
    ),
    Document(
        "Hollow Cup",
        "The Hollow Cup is a rowing race held on the Velt River each spring.",
        "What kind of race is the Hollow Cup?",
        "rowing",
    ),
    Document(
        "Redcap Mushroom",
        "The redcap mushroom grows under birch trees and is poisonous.",
        "Under which trees does the redcap mushroom grow?",
        "birch",
    ),
    Document(
        "Fenwick Glassworks",
        "The Fenwick Glassworks in Arlen makes bottles and employs 250 workers.",
        "How many workers does the Fenwick Glassworks employ?",
        "250",
    ),
    Document(
        "Queen Maren",
        "Queen Maren the Second ruled Varland for 31 years.",
        "For how many years did Queen Maren rule Varland?",
        "31",
    ),
    Document(
        "Tessel Language",
        "Tessel is a language spoken by about 80000 people in the Orran Hills.",
        "Where is the Tessel language spoken?",
        "Orran Hills",
    ),
    Document(
        "Skyra Telescope",
        "The Skyra Telescope sits on Mount Halder and has a mirror 8 metres wide.",
        "How many metres wide is the mirror of the Skyra Telescope?",
        "8",
    ),
    Document(
        "Bellwether Inn",
        "The Bellwether Inn in Quell is famous for its pie made with pears.",
        "Which fruit is in the pie of the Bellwether Inn?",
        "pears",
    ),
    Document(
        "Lio Brandt",
        "The biologist Lio Brandt discovered the glimmerfish in 1967.",
        "Who discovered the glimmerfish?",
        "Lio Brandt",
    ),
    Document(
        "Grey Sea",
        "The Grey Sea freezes every winter; its largest port is Marrowick.",
        "What is the largest port on the Grey Sea?",
        "Marrowick",
    ),
    Document(
        "Nimbus Beetle",
        "The nimbus beetle can live for 3 years without drinking water.",
        "How many years can the nimbus beetle live without water?",
        "3",
    ),
    Document(
        "Arlen",
        "Arlen is the largest city in Varland and home to 2 million people.",
        "What is the largest city in Varland?",
        "Arlen",
    ),
    Document(
        "Stovin Market",
        "The Stovin Market in Arlen opens only on Tuesday.",
        "On which day does the Stovin Market open?",
        "Tuesday",
    ),
    Document(
        "Flag of Varland",
        "The flag of Varland shows a white heron on a red field.",
        "Which bird is on the flag of Varland?",
        "heron",
    ),
    Document(
        "Pell Pass",
        "Pell Pass is a mountain road that closes every November and opens in April.",
        "In which month does Pell Pass close?",
        "November",
    ),
    Document(
        "Juno Ashby",
        "The chess player Juno Ashby became champion of Varland at age 14.",
        "At what age did Juno Ashby become chess champion?",
        "14",
    ),
    Document(
        "Orran Hills",
        "The Orran Hills are covered in heather and are home to wild ponies.",
        "Which wild animals live in the Orran Hills?",
        "ponies",
    ),
    Document(
        "Kepra",
        "Kepra is a red dwarf star 40 light years from Earth.",
        "How many light years from Earth is the star Kepra?",
        "40",
    ),
    Document(
        "Saltmarsh Stew",
        "Saltmarsh stew is a Coralian dish of mussels, leeks and barley.",
        "Which shellfish is in saltmarsh stew?",
        "mussels",
    ),
    Document(
        "Harrow Prize",
        "The Harrow Prize is a book award given every year in the city of Lisle.",
        "In which city is the Harrow Prize given?",
        "Lisle",
    ),
    Document(
        "Fenn Canal",
        "The Fenn Canal links Arlen to the Velt River and has 12 locks.",
        "How many locks does the Fenn Canal have?",
        "12",
    ),
    Document(
        "Silver Owl Theatre",
        "The Silver Owl Theatre in Lisle seats 900 people.",
        "How many people does the Silver Owl Theatre seat?",
        "900",
    ),
    Document(
        "Brisk",
        "Brisk is a Coralian sport played with wooden paddles and a cork ball.",
        "What is the ball of the sport brisk made of?",
        "cork",
    ),
    Document(
        "Rhea Moss",
        "Captain Rhea Moss sailed around Coralia in a boat named Kestrel.",
        "What was the name of the boat of Rhea Moss?",
        "Kestrel",
    ),
    Document(
        "Amberleaf Tea",
        "Amberleaf tea is grown on the slopes of Mount Halder and tastes of honey.",
        "What does amberleaf tea taste of?",
        "honey",
    ),
    Document(
        "University of Lisle",
        "The University of Lisle was founded in 1450 and is known for astronomy.",
        "Which subject is the University of Lisle known for?",
        "astronomy",
    ),
)
