"""Generate the bundled tool-calling data: `python scripts/build_data/tool_calling.py [--out DIR]`.

Deterministic (one seeded random generator, fixed iteration order). Writes BFCL-format JSON
Lines, so the task reads them with the same loader as BFCL's own files:

- `train.jsonl`, `test.jsonl`: {"id", "question": [[{"role": "user", "content"}]], "function"}
- `possible_answer/train.jsonl`, `possible_answer/test.jsonl`: {"id", "ground_truth"}

Requests come from templates over the functions below, in BFCL's four categories: simple
(one function offered, one call), multiple (2-4 offered, one call), parallel (one function,
2-3 calls) and parallel_multiple (2-4 offered, 2-3 calls of different functions). Allowed
values follow BFCL's conventions: alternatives a user could mean ("Paris", "Paris, France"), an
optional parameter the request leaves unsaid is [default, ""] when the schema has a default
and absent (must not be passed) otherwise. Every fifth row of each category is test.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

SEED = 20240521
COUNTS = {"simple": 140, "multiple": 120, "parallel": 80, "parallel_multiple": 80}
TEST_EVERY = 5  # row i of a category is test when i % TEST_EVERY == TEST_EVERY - 1
OUT_DIR = Path(__file__).resolve().parents[2] / "src" / "mrtpo" / "data" / "tool_calling"

Answer = dict[str, list[Any]]
Request = tuple[str, Answer]  # (request sentence, the call's parameters with allowed values)


# ---------------------------------------------------------------- function schemas (BFCL form)
def param(kind: str, description: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "description": description, **extra}


def function(
    name: str, description: str, properties: dict[str, Any], required: list[str]
) -> dict[str, Any]:
    return {
        "name": name,
        "description": description,
        "parameters": {"type": "dict", "properties": properties, "required": required},
    }


UNITS = ["km", "mile", "meter", "foot", "kg", "pound", "liter", "gallon", "celsius", "fahrenheit"]
LANGUAGES = ["french", "spanish", "german", "italian", "japanese"]
WEEKDAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]

FUNCTIONS = [
    function(
        "get_current_weather",
        "Get the current weather in a city.",
        {
            "location": param("string", "City name, e.g. Paris."),
            "unit": param(
                "string", "Temperature unit.", enum=["celsius", "fahrenheit"], default="celsius"
            ),
        },
        ["location"],
    ),
    function(
        "get_weather_forecast",
        "Get the daily weather forecast for a city.",
        {
            "location": param("string", "City name."),
            "days": param("integer", "Number of days to forecast, 1 to 7."),
            "include_hourly": param("boolean", "Also return hourly data.", default=False),
        },
        ["location", "days"],
    ),
    function(
        "create_calendar_event",
        "Add an event to the user's calendar.",
        {
            "title": param("string", "Event title."),
            "date": param("string", "Date as YYYY-MM-DD."),
            "start_time": param("string", "Start time as HH:MM, 24-hour."),
            "duration_minutes": param("integer", "Length in minutes.", default=60),
            "attendees": param("array", "Email addresses of the guests.", items={"type": "string"}),
            "reminder": param(
                "dict",
                "A reminder before the event.",
                properties={
                    "minutes_before": param("integer", "Minutes before the start."),
                    "method": param("string", "How to remind.", enum=["popup", "email"]),
                },
            ),
        },
        ["title", "date", "start_time"],
    ),
    function(
        "list_calendar_events",
        "List the events of one day.",
        {
            "date": param("string", "Date as YYYY-MM-DD."),
            "calendar": param("string", "Which calendar.", enum=["work", "personal", "family"]),
        },
        ["date"],
    ),
    function(
        "convert_units",
        "Convert a quantity from one unit to another.",
        {
            "value": param("float", "The quantity to convert."),
            "from_unit": param("string", "Unit of the quantity.", enum=UNITS),
            "to_unit": param("string", "Unit to convert to.", enum=UNITS),
        },
        ["value", "from_unit", "to_unit"],
    ),
    function(
        "convert_currency",
        "Convert money between currencies at today's rate.",
        {
            "amount": param("float", "Amount of money."),
            "from_currency": param("string", "ISO code, e.g. EUR."),
            "to_currency": param("string", "ISO code, e.g. USD."),
        },
        ["amount", "from_currency", "to_currency"],
    ),
    function(
        "calculate",
        "Apply an arithmetic operation to two numbers.",
        {
            "operation": param(
                "string", "The operation.", enum=["add", "subtract", "multiply", "divide"]
            ),
            "a": param("float", "First number."),
            "b": param("float", "Second number."),
        },
        ["operation", "a", "b"],
    ),
    function(
        "calculate_percentage",
        "Compute what percent one number is of another.",
        {"part": param("float", "The part."), "whole": param("float", "The whole.")},
        ["part", "whole"],
    ),
    function(
        "calculate_tip",
        "Compute the tip for a bill.",
        {
            "bill_amount": param("float", "Bill total."),
            "tip_percent": param("float", "Tip percentage, e.g. 15."),
            "split_between": param("integer", "Number of people paying.", default=1),
        },
        ["bill_amount", "tip_percent"],
    ),
    function(
        "web_search",
        "Search the web.",
        {
            "query": param("string", "Search terms."),
            "max_results": param("integer", "How many results.", default=5),
        },
        ["query"],
    ),
    function(
        "search_news",
        "Find recent news articles on a topic.",
        {
            "topic": param("string", "The topic."),
            "language": param(
                "string", "Article language.", enum=["en", "fr", "de", "es"], default="en"
            ),
        },
        ["topic"],
    ),
    function(
        "send_email",
        "Send an email.",
        {
            "to": param("string", "Recipient email address."),
            "subject": param("string", "Subject line."),
            "body": param("string", "Message text."),
            "cc": param("array", "Addresses to copy.", items={"type": "string"}),
        },
        ["to", "subject", "body"],
    ),
    function(
        "send_text_message",
        "Send a text message to a phone number.",
        {
            "phone_number": param("string", "Phone number with country code."),
            "message": param("string", "Message text."),
        },
        ["phone_number", "message"],
    ),
    function(
        "book_restaurant",
        "Reserve a table at a restaurant.",
        {
            "restaurant": param("string", "Restaurant name."),
            "date": param("string", "Date as YYYY-MM-DD."),
            "time": param("string", "Time as HH:MM, 24-hour."),
            "party": param(
                "dict",
                "Who is coming.",
                properties={
                    "adults": param("integer", "Number of adults."),
                    "children": param("integer", "Number of children."),
                },
            ),
        },
        ["restaurant", "date", "time", "party"],
    ),
    function(
        "book_hotel",
        "Book a hotel room.",
        {
            "city": param("string", "City of the hotel."),
            "check_in": param("string", "Arrival date as YYYY-MM-DD."),
            "check_out": param("string", "Departure date as YYYY-MM-DD."),
            "guests": param("integer", "Number of guests."),
            "room_type": param("string", "Room type.", enum=["single", "double", "suite"]),
        },
        ["city", "check_in", "check_out", "guests"],
    ),
    function(
        "book_flight",
        "Book a one-way flight.",
        {
            "origin": param("string", "Departure city."),
            "destination": param("string", "Arrival city."),
            "date": param("string", "Date as YYYY-MM-DD."),
            "seat_class": param(
                "string",
                "Cabin class.",
                enum=["economy", "premium", "business", "first"],
                default="economy",
            ),
        },
        ["origin", "destination", "date"],
    ),
    function(
        "set_alarm",
        "Set an alarm.",
        {
            "time": param("string", "Time as HH:MM, 24-hour."),
            "label": param("string", "Alarm label."),
            "repeat_days": param(
                "array", "Days to repeat on.", items={"type": "string", "enum": WEEKDAYS}
            ),
        },
        ["time"],
    ),
    function(
        "set_timer",
        "Start a countdown timer.",
        {
            "minutes": param("integer", "Duration in minutes."),
            "label": param("string", "Timer label."),
        },
        ["minutes"],
    ),
    function(
        "translate_text",
        "Translate text into another language.",
        {
            "text": param("string", "Text to translate."),
            "target_language": param("string", "Language to translate into.", enum=LANGUAGES),
        },
        ["text", "target_language"],
    ),
    function(
        "get_stock_price",
        "Get the latest price of a stock.",
        {
            "symbol": param("string", "Ticker symbol, e.g. AAPL."),
            "exchange": param("string", "Stock exchange.", enum=["NASDAQ", "NYSE"]),
        },
        ["symbol"],
    ),
    function(
        "create_todo",
        "Add a task to the to-do list.",
        {
            "task": param("string", "What to do."),
            "priority": param(
                "string", "Priority.", enum=["low", "medium", "high"], default="medium"
            ),
            "due_date": param("string", "Due date as YYYY-MM-DD."),
        },
        ["task"],
    ),
    function(
        "play_music",
        "Play a song, artist or playlist.",
        {
            "query": param("string", "Song, artist or playlist name."),
            "shuffle": param("boolean", "Shuffle playback.", default=False),
            "volume": param("integer", "Volume from 0 to 100."),
        },
        ["query"],
    ),
    function(
        "order_food",
        "Order food for delivery.",
        {
            "restaurant": param("string", "Restaurant name."),
            "items": param(
                "array",
                "Dishes to order.",
                items={
                    "type": "dict",
                    "properties": {
                        "name": param("string", "Dish name."),
                        "quantity": param("integer", "How many."),
                    },
                },
            ),
        },
        ["restaurant", "items"],
    ),
    function(
        "get_directions",
        "Get directions between two places.",
        {
            "origin": param("string", "Start address or place."),
            "destination": param("string", "End address or place."),
            "mode": param(
                "string",
                "Travel mode.",
                enum=["driving", "walking", "transit", "cycling"],
                default="driving",
            ),
        },
        ["origin", "destination"],
    ),
    function(
        "set_thermostat",
        "Set the thermostat temperature in celsius.",
        {
            "temperature": param("float", "Target temperature."),
            "room": param("string", "Room name."),
        },
        ["temperature"],
    ),
    function(
        "find_recipes",
        "Find recipes that use some ingredients.",
        {
            "ingredients": param("array", "Ingredients to use.", items={"type": "string"}),
            "max_minutes": param("integer", "Longest cooking time."),
        },
        ["ingredients"],
    ),
]
FUNCTIONS_BY_NAME = {f["name"]: f for f in FUNCTIONS}


# ---------------------------------------------------------------- slot values
CITIES = [
    ("Paris", ["Paris", "Paris, France"]),
    ("Tokyo", ["Tokyo", "Tokyo, Japan"]),
    ("New York", ["New York", "New York, NY", "New York City", "NYC"]),
    ("London", ["London", "London, UK", "London, England"]),
    ("Berlin", ["Berlin", "Berlin, Germany"]),
    ("Sydney", ["Sydney", "Sydney, Australia"]),
    ("Toronto", ["Toronto", "Toronto, Canada"]),
    ("Madrid", ["Madrid", "Madrid, Spain"]),
    ("Rome", ["Rome", "Rome, Italy"]),
    ("Chicago", ["Chicago", "Chicago, IL"]),
    ("Lisbon", ["Lisbon", "Lisbon, Portugal"]),
    ("Seoul", ["Seoul", "Seoul, South Korea"]),
    ("Nairobi", ["Nairobi", "Nairobi, Kenya"]),
    ("Mexico City", ["Mexico City", "Mexico City, Mexico"]),
]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"]  # fmt: skip
PEOPLE = [
    ("Alice", "alice@example.com"),
    ("Bob", "bob@example.com"),
    ("Carmen", "carmen@example.com"),
    ("Dev", "dev@example.com"),
    ("Emma", "emma@example.com"),
    ("Farid", "farid@example.com"),
    ("Grace", "grace@example.com"),
]
RESTAURANTS = [
    "Luigi's Trattoria",
    "Sakura Sushi",
    "The Green Fork",
    "Casa Miguel",
    "Le Petit Bistro",
    "Spice Route",
]
DISHES = [
    "margherita pizza",
    "pad thai",
    "caesar salad",
    "veggie burger",
    "miso soup",
    "chicken curry",
    "garlic bread",
]
SEARCHES = [
    "best hiking trails near Denver",
    "how to repot a cactus",
    "cheap flights to Iceland",
    "python list comprehension examples",
    "symptoms of vitamin D deficiency",
    "history of the Eiffel Tower",
    "how to fix a leaking tap",
    "electric car charging stations in Oslo",
]
NEWS_TOPICS = ["renewable energy", "the football world cup", "space exploration", "electric cars", "climate policy", "artificial intelligence"]  # fmt: skip
SONGS = [
    "Bohemian Rhapsody",
    "Taylor Swift",
    "lo-fi study beats",
    "Miles Davis",
    "Clair de Lune",
    "Daft Punk",
]
STOCKS = [("Apple", "AAPL", "NASDAQ"), ("Microsoft", "MSFT", "NASDAQ"), ("Coca-Cola", "KO", "NYSE"), ("Nike", "NKE", "NYSE"), ("Tesla", "TSLA", "NASDAQ"), ("Walmart", "WMT", "NYSE")]  # fmt: skip
CURRENCIES = [("euros", "EUR"), ("US dollars", "USD"), ("yen", "JPY"), ("British pounds", "GBP"), ("Swiss francs", "CHF"), ("Canadian dollars", "CAD")]  # fmt: skip
PHRASES = ["Good morning", "Where is the train station?", "Thank you for your help", "I would like a coffee", "See you tomorrow"]  # fmt: skip
TASKS = ["buy milk", "call the dentist", "renew my passport", "water the plants", "pay the electricity bill", "book a haircut"]  # fmt: skip
INGREDIENTS = [
    "chicken",
    "rice",
    "tomatoes",
    "spinach",
    "eggs",
    "mushrooms",
    "tofu",
    "lentils",
    "potatoes",
]
PLACES = ["the central station", "the airport", "the city museum", "Maple Street 12", "the university library", "Riverside Park"]  # fmt: skip
ROOMS = ["living room", "bedroom", "kitchen", "office"]
MESSAGES = ["Running ten minutes late", "Dinner is ready", "Call me when you land", "Happy birthday!", "The meeting moved to 3 pm"]  # fmt: skip
PHONES = ["+1-555-0134", "+44-20-7946-0958", "+33-1-7035-1200", "+81-3-5555-0101"]
EVENT_TITLES = [
    "Team standup",
    "Dentist appointment",
    "Project review",
    "Lunch with Sam",
    "Yoga class",
    "Budget meeting",
]


def date_slot(rng: random.Random) -> tuple[str, str]:
    """(how the request says it, YYYY-MM-DD)."""
    month, day = rng.randrange(1, 13), rng.randrange(1, 29)
    iso = f"2025-{month:02d}-{day:02d}"
    spoken = rng.choice(
        [f"{MONTHS[month - 1]} {day}, 2025", f"{day} {MONTHS[month - 1]} 2025", iso]
    )
    return spoken, iso


def time_slot(rng: random.Random) -> tuple[str, str]:
    """(how the request says it, HH:MM 24-hour)."""
    hour, minute = rng.randrange(6, 23), rng.choice([0, 15, 30, 45])
    clock = f"{hour:02d}:{minute:02d}"
    twelve = f"{(hour - 1) % 12 + 1}:{minute:02d} {'am' if hour < 12 else 'pm'}"
    return rng.choice([twelve, clock]), clock


def number_words(count: int) -> str:
    return ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight"][count]


def pick(rng: random.Random, *texts: str) -> str:
    return rng.choice(texts)


# ---------------------------------------------------------------- request templates
def weather(rng: random.Random) -> Request:
    city, allowed = rng.choice(CITIES)
    if rng.random() < 0.5:
        unit = rng.choice(["celsius", "fahrenheit"])
        text = pick(rng, f"What's the weather in {city} in {unit}?", f"Tell me the current temperature in {city}, in degrees {unit}.")  # fmt: skip
        return text, {"location": allowed, "unit": [unit]}
    text = pick(
        rng,
        f"What's the weather like in {city} right now?",
        f"How warm is it in {city} at the moment?",
    )
    return text, {"location": allowed, "unit": ["celsius", ""]}


def forecast(rng: random.Random) -> Request:
    city, allowed = rng.choice(CITIES)
    days = rng.randrange(2, 8)
    if rng.random() < 0.35:
        text = f"Give me the {days}-day forecast for {city}, hour by hour."
        return text, {"location": allowed, "days": [days], "include_hourly": [True]}
    text = pick(rng, f"What will the weather be in {city} over the next {days} days?", f"Get a {days}-day forecast for {city}.")  # fmt: skip
    return text, {"location": allowed, "days": [days], "include_hourly": [False, ""]}


def calendar_event(rng: random.Random) -> Request:
    title = rng.choice(EVENT_TITLES)
    day_text, iso = date_slot(rng)
    time_text, clock = time_slot(rng)
    answer: Answer = {
        "title": [title],
        "date": [iso],
        "start_time": [clock],
        "duration_minutes": [60, ""],
    }
    text = f"Add '{title}' to my calendar on {day_text} at {time_text}"
    extra = rng.randrange(4)
    if extra == 1:
        minutes = rng.choice([30, 45, 90, 120])
        text += f" for {minutes} minutes"
        answer["duration_minutes"] = [minutes]
    elif extra == 2:
        guests = rng.sample(PEOPLE, 2)
        text += f" and invite {guests[0][1]} and {guests[1][1]}"
        answer["attendees"] = [[guests[0][1], guests[1][1]]]
    elif extra == 3:
        before, method = rng.choice([10, 15, 30]), rng.choice(["popup", "email"])
        text += f", with an {method} reminder {before} minutes before" if method == "email" else f", with a popup reminder {before} minutes before"  # fmt: skip
        answer["reminder"] = [{"minutes_before": [before], "method": [method]}]
    return text + ".", answer


def calendar_list(rng: random.Random) -> Request:
    day_text, iso = date_slot(rng)
    if rng.random() < 0.5:
        calendar = rng.choice(["work", "personal", "family"])
        return f"What's on my {calendar} calendar on {day_text}?", {
            "date": [iso],
            "calendar": [calendar],
        }
    return pick(
        rng, f"What do I have scheduled on {day_text}?", f"List my events for {day_text}."
    ), {"date": [iso]}


UNIT_PAIRS = [("km", "mile", "kilometers", "miles"), ("mile", "km", "miles", "kilometers"), ("meter", "foot", "meters", "feet"), ("foot", "meter", "feet", "meters"), ("kg", "pound", "kilograms", "pounds"), ("pound", "kg", "pounds", "kilograms"), ("liter", "gallon", "liters", "gallons"), ("gallon", "liter", "gallons", "liters"), ("celsius", "fahrenheit", "degrees celsius", "fahrenheit"), ("fahrenheit", "celsius", "degrees fahrenheit", "celsius")]  # fmt: skip


def units(rng: random.Random) -> Request:
    source, target, source_words, target_words = rng.choice(UNIT_PAIRS)
    value = rng.choice([rng.randrange(1, 200), rng.randrange(1, 100) + 0.5])
    text = pick(rng, f"Convert {value} {source_words} to {target_words}.", f"How many {target_words} is {value} {source_words}?")  # fmt: skip
    return text, {"value": [float(value)], "from_unit": [source], "to_unit": [target]}


def currency(rng: random.Random) -> Request:
    (source_words, source), (target_words, target) = rng.sample(CURRENCIES, 2)
    amount = rng.choice([20, 50, 100, 250, 1000, 75.5])
    text = pick(rng, f"How much is {amount} {source_words} in {target_words}?", f"Convert {amount} {source_words} to {target_words}.")  # fmt: skip
    return text, {"amount": [float(amount)], "from_currency": [source], "to_currency": [target]}


def arithmetic(rng: random.Random) -> Request:
    a, b = rng.randrange(2, 500), rng.randrange(2, 50)
    operation, text = rng.choice(
        [
            ("add", f"What is {a} plus {b}?"),
            ("subtract", f"Subtract {b} from {a}."),
            ("multiply", f"Multiply {a} by {b}."),
            ("divide", f"What is {a} divided by {b}?"),
        ]
    )
    return text, {"operation": [operation], "a": [float(a)], "b": [float(b)]}


def percentage(rng: random.Random) -> Request:
    whole = rng.choice([40, 80, 120, 250, 600])
    part = rng.randrange(1, whole)
    text = pick(
        rng, f"What percent of {whole} is {part}?", f"Work out {part} as a percentage of {whole}."
    )
    return text, {"part": [float(part)], "whole": [float(whole)]}


def tip(rng: random.Random) -> Request:
    bill = rng.choice([42, 58.5, 87, 120, 33.2, 240])
    percent = rng.choice([10, 15, 18, 20])
    if rng.random() < 0.4:
        people = rng.randrange(2, 6)
        text = f"Calculate a {percent}% tip on a ${bill} bill split between {number_words(people)} people."
        return text, {
            "bill_amount": [float(bill)],
            "tip_percent": [float(percent)],
            "split_between": [people],
        }
    text = pick(rng, f"How much is a {percent}% tip on ${bill}?", f"Calculate a {percent} percent tip for a bill of ${bill}.")  # fmt: skip
    return text, {
        "bill_amount": [float(bill)],
        "tip_percent": [float(percent)],
        "split_between": [1, ""],
    }


def search(rng: random.Random) -> Request:
    query = rng.choice(SEARCHES)
    if rng.random() < 0.35:
        count = rng.choice([3, 10, 20])
        return f'Search the web for "{query}" and show {count} results.', {
            "query": [query],
            "max_results": [count],
        }
    text = pick(rng, f'Search the web for "{query}".', f"Look up {query} online.")
    return text, {"query": [query], "max_results": [5, ""]}


def news(rng: random.Random) -> Request:
    topic = rng.choice(NEWS_TOPICS)
    if rng.random() < 0.4:
        words, code = rng.choice([("French", "fr"), ("German", "de"), ("Spanish", "es")])
        return f"Find news about {topic} in {words}.", {"topic": [topic], "language": [code]}
    text = pick(rng, f"Find the latest news on {topic}.", f"Any recent articles about {topic}?")
    return text, {"topic": [topic], "language": ["en", ""]}


def email(rng: random.Random) -> Request:
    (name, address), copy = rng.sample(PEOPLE, 2)
    subject = rng.choice(["Lunch", "Project update", "Weekend plans", "Invoice", "Meeting notes"])
    body = rng.choice(["See you at noon.", "The draft is ready for review.", "Are you free on Saturday?", "Please find the numbers attached."])  # fmt: skip
    text = f'Email {address} with the subject "{subject}" saying "{body}"'
    answer: Answer = {"to": [address], "subject": [subject], "body": [body]}
    if rng.random() < 0.35:
        text += f" and copy {copy[1]}"
        answer["cc"] = [[copy[1]]]
    return text + ".", answer


def text_message(rng: random.Random) -> Request:
    phone, message = rng.choice(PHONES), rng.choice(MESSAGES)
    text = pick(
        rng, f'Text {phone}: "{message}"', f'Send "{message}" as a text message to {phone}.'
    )
    return text, {"phone_number": [phone], "message": [message]}


def restaurant(rng: random.Random) -> Request:
    name = rng.choice(RESTAURANTS)
    day_text, iso = date_slot(rng)
    time_text, clock = time_slot(rng)
    adults, children = rng.randrange(1, 6), rng.choice([0, 0, 1, 2, 3])
    party = f"{number_words(adults)} adults" if adults > 1 else "one adult"
    if children:
        party += f" and {number_words(children)} {'child' if children == 1 else 'children'}"
    text = pick(rng, f"Book a table at {name} for {party} on {day_text} at {time_text}.", f"Reserve {name} on {day_text} at {time_text} for {party}.")  # fmt: skip
    spec = {"adults": [adults], "children": [children, ""] if children == 0 else [children]}
    return text, {"restaurant": [name], "date": [iso], "time": [clock], "party": [spec]}


def hotel(rng: random.Random) -> Request:
    city, allowed = rng.choice(CITIES)
    month, day, nights = rng.randrange(1, 13), rng.randrange(1, 20), rng.randrange(1, 6)
    check_in, check_out = f"2025-{month:02d}-{day:02d}", f"2025-{month:02d}-{day + nights:02d}"
    guests = rng.randrange(1, 5)
    text = f"Book a hotel in {city} from {check_in} to {check_out} for {number_words(guests)} guest{'s' if guests > 1 else ''}"  # fmt: skip
    answer: Answer = {
        "city": allowed,
        "check_in": [check_in],
        "check_out": [check_out],
        "guests": [guests],
    }
    if rng.random() < 0.4:
        room = rng.choice(["single", "double", "suite"])
        text += f", a {room} room" if room != "suite" else ", a suite"
        answer["room_type"] = [room]
    return text + ".", answer


def flight(rng: random.Random) -> Request:
    (origin, origin_allowed), (destination, destination_allowed) = rng.sample(CITIES, 2)
    day_text, iso = date_slot(rng)
    answer: Answer = {"origin": origin_allowed, "destination": destination_allowed, "date": [iso]}
    if rng.random() < 0.4:
        seat = rng.choice(["premium", "business", "first"])
        answer["seat_class"] = [seat]
        return f"Book a {seat} class flight from {origin} to {destination} on {day_text}.", answer
    answer["seat_class"] = ["economy", ""]
    return pick(rng, f"Book a flight from {origin} to {destination} on {day_text}.", f"I need to fly {origin} to {destination} on {day_text}, please book it.") , answer  # fmt: skip


def alarm(rng: random.Random) -> Request:
    time_text, clock = time_slot(rng)
    choice = rng.randrange(3)
    if choice == 1:
        label = rng.choice(["Gym", "Take medicine", "Leave for work"])
        return f"Set an alarm for {time_text} labeled '{label}'.", {
            "time": [clock],
            "label": [label],
        }
    if choice == 2:
        days = sorted(rng.sample(range(5), 2))
        names = [WEEKDAYS[d] for d in days]
        text = f"Wake me up at {time_text} every {names[0].title()} and {names[1].title()}."
        return text, {"time": [clock], "repeat_days": [names]}
    return pick(rng, f"Set an alarm for {time_text}.", f"Wake me up at {time_text}."), {
        "time": [clock]
    }


def timer(rng: random.Random) -> Request:
    minutes = rng.choice([3, 5, 10, 12, 25, 45])
    if rng.random() < 0.4:
        label = rng.choice(["pasta", "tea", "laundry"])
        return f"Start a {minutes}-minute timer for the {label}.", {
            "minutes": [minutes],
            "label": [label],
        }
    return pick(rng, f"Set a timer for {minutes} minutes.", f"Start a {minutes} minute countdown."), {"minutes": [minutes]}  # fmt: skip


def translate(rng: random.Random) -> Request:
    phrase, language = rng.choice(PHRASES), rng.choice(LANGUAGES)
    text = pick(rng, f'Translate "{phrase}" into {language.title()}.', f'How do you say "{phrase}" in {language.title()}?')  # fmt: skip
    return text, {"text": [phrase], "target_language": [language]}


def stock(rng: random.Random) -> Request:
    company, symbol, exchange = rng.choice(STOCKS)
    if rng.random() < 0.3:
        return f"What's {symbol} trading at on the {exchange}?", {
            "symbol": [symbol],
            "exchange": [exchange],
        }
    return pick(rng, f"What's the current stock price of {company} ({symbol})?", f"Get me the latest {symbol} share price."), {"symbol": [symbol]}  # fmt: skip


def todo(rng: random.Random) -> Request:
    task = rng.choice(TASKS)
    answer: Answer = {"task": [task], "priority": ["medium", ""]}
    text = f"Add '{task}' to my to-do list"
    if rng.random() < 0.5:
        priority = rng.choice(["low", "high"])
        text += f" with {priority} priority"
        answer["priority"] = [priority]
    if rng.random() < 0.4:
        day_text, iso = date_slot(rng)
        text += f", due {day_text}"
        answer["due_date"] = [iso]
    return text + ".", answer


def music(rng: random.Random) -> Request:
    query = rng.choice(SONGS)
    answer: Answer = {"query": [query], "shuffle": [False, ""]}
    text = f"Play {query}"
    if rng.random() < 0.4:
        text += " on shuffle"
        answer["shuffle"] = [True]
    if rng.random() < 0.4:
        volume = rng.choice([20, 40, 60, 80])
        text += f" at volume {volume}"
        answer["volume"] = [volume]
    return text + ".", answer


def food(rng: random.Random) -> Request:
    name = rng.choice(RESTAURANTS)
    dishes = rng.sample(DISHES, rng.randrange(1, 3))
    counts = [rng.randrange(1, 4) for _ in dishes]
    listed = ", ".join(f"{count} x {dish}" for dish, count in zip(dishes, counts, strict=True))
    items = [
        {"name": [dish], "quantity": [count]} for dish, count in zip(dishes, counts, strict=True)
    ]
    text = pick(
        rng, f"Order from {name} for delivery: {listed}.", f"Get me {listed} delivered from {name}."
    )
    return text, {"restaurant": [name], "items": [items]}


def directions(rng: random.Random) -> Request:
    origin, destination = rng.sample(PLACES, 2)
    if rng.random() < 0.5:
        mode, words = rng.choice(
            [("walking", "on foot"), ("transit", "by public transit"), ("cycling", "by bike")]
        )
        return f"How do I get from {origin} to {destination} {words}?", {"origin": [origin], "destination": [destination], "mode": [mode]}  # fmt: skip
    return f"Give me driving directions from {origin} to {destination}.", {"origin": [origin], "destination": [destination], "mode": ["driving", ""]}  # fmt: skip


def thermostat(rng: random.Random) -> Request:
    temperature = rng.choice([18, 19.5, 20, 21, 22.5, 23])
    if rng.random() < 0.5:
        room = rng.choice(ROOMS)
        return f"Set the {room} thermostat to {temperature} degrees.", {"temperature": [float(temperature)], "room": [room]}  # fmt: skip
    return f"Set the thermostat to {temperature} degrees celsius.", {
        "temperature": [float(temperature)]
    }


def recipes(rng: random.Random) -> Request:
    ingredients = rng.sample(INGREDIENTS, rng.randrange(2, 4))
    listed = ", ".join(ingredients[:-1]) + f" and {ingredients[-1]}"
    answer: Answer = {"ingredients": [ingredients]}
    text = f"Find recipes with {listed}"
    if rng.random() < 0.4:
        minutes = rng.choice([20, 30, 45])
        text += f" that take at most {minutes} minutes"
        answer["max_minutes"] = [minutes]
    return text + ".", answer


TEMPLATES: dict[str, Callable[[random.Random], Request]] = {
    "get_current_weather": weather,
    "get_weather_forecast": forecast,
    "create_calendar_event": calendar_event,
    "list_calendar_events": calendar_list,
    "convert_units": units,
    "convert_currency": currency,
    "calculate": arithmetic,
    "calculate_percentage": percentage,
    "calculate_tip": tip,
    "web_search": search,
    "search_news": news,
    "send_email": email,
    "send_text_message": text_message,
    "book_restaurant": restaurant,
    "book_hotel": hotel,
    "book_flight": flight,
    "set_alarm": alarm,
    "set_timer": timer,
    "translate_text": translate,
    "get_stock_price": stock,
    "create_todo": todo,
    "play_music": music,
    "order_food": food,
    "get_directions": directions,
    "set_thermostat": thermostat,
    "find_recipes": recipes,
}


# ---------------------------------------------------------------- rows
def join_requests(rng: random.Random, sentences: list[str]) -> str:
    """Several requests as one user message."""
    if rng.random() < 0.5:
        return "Please do these:\n" + "\n".join(
            f"{i}. {s}" for i, s in enumerate(sentences, start=1)
        )
    joined = sentences[0]
    for sentence in sentences[1:]:
        joined += " " + rng.choice(["Also, ", "And ", "Then "]) + sentence[0].lower() + sentence[1:]
    return joined


def distinct_requests(rng: random.Random, name: str, count: int) -> list[Request]:
    """`count` requests for one function with different calls."""
    requests: list[Request] = []
    while len(requests) < count:
        text, answer = TEMPLATES[name](rng)
        if all(answer != other for _, other in requests):
            requests.append((text, answer))
    return requests


def make_row(rng: random.Random, category: str) -> tuple[str, list[str], list[dict[str, Answer]]]:
    """(user message, offered function names, ground truth) for one request of `category`."""
    names = list(TEMPLATES)
    if category in ("simple", "multiple"):
        target = rng.choice(names)
        (text, answer), calls = TEMPLATES[target](rng), [target]
        requests = [(text, answer)]
    elif category == "parallel":
        target = rng.choice(names)
        requests = distinct_requests(rng, target, rng.choice([2, 2, 3]))
        calls = [target] * len(requests)
    else:  # parallel_multiple: different functions, one call each
        calls = rng.sample(names, rng.choice([2, 2, 3]))
        requests = [TEMPLATES[name](rng) for name in calls]
    offered = sorted(set(calls))
    if category in ("multiple", "parallel_multiple"):
        wanted = min(4, len(offered) + rng.randrange(1, 3)) if category == "multiple" else min(4, len(offered) + rng.randrange(0, 2))  # fmt: skip
        distractors = [name for name in names if name not in offered]
        offered += rng.sample(distractors, wanted - len(offered))
        rng.shuffle(offered)
    message = (
        requests[0][0] if len(requests) == 1 else join_requests(rng, [text for text, _ in requests])
    )
    ground_truth = [{name: answer} for name, (_, answer) in zip(calls, requests, strict=True)]
    return message, offered, ground_truth


def build_rows() -> dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """{"train" | "test": (question rows, answer rows)}, deterministic."""
    rng = random.Random(SEED)
    splits: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {
        "train": ([], []),
        "test": ([], []),
    }
    seen: set[str] = set()
    for category, count in COUNTS.items():
        index = 0
        while index < count:
            message, offered, ground_truth = make_row(rng, category)
            if message in seen:
                continue
            seen.add(message)
            row_id = f"{category}_{index}"
            split = "test" if index % TEST_EVERY == TEST_EVERY - 1 else "train"
            questions, answers = splits[split]
            questions.append(
                {
                    "id": row_id,
                    "question": [[{"role": "user", "content": message}]],
                    "function": [FUNCTIONS_BY_NAME[name] for name in offered],
                }
            )
            answers.append({"id": row_id, "ground_truth": ground_truth})
            index += 1
    return splits


def write(out_dir: Path) -> list[Path]:
    """Write the four JSON Lines files under `out_dir`; returns their paths."""
    paths = []
    (out_dir / "possible_answer").mkdir(parents=True, exist_ok=True)
    for split, (questions, answers) in build_rows().items():
        for path, rows in ((out_dir / f"{split}.jsonl", questions), (out_dir / "possible_answer" / f"{split}.jsonl", answers)):  # fmt: skip
            path.write_text(
                "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows),
                encoding="utf-8",
            )
            paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=OUT_DIR,
        help="folder to write into (default: src/mrtpo/data/tool_calling)",
    )
    for path in write(parser.parse_args(argv).out):
        print(path)


if __name__ == "__main__":
    main()
