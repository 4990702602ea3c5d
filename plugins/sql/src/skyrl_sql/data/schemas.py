"""The built-in databases: four small schemas whose rows are generated from a fixed seed.

Every DDL statement and gold query here is portable between SQLite and DuckDB (no integer
division, no dialect-only functions, dates stored as ISO text), so both engines give one answer.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

Rows = dict[str, list[tuple]]

FIRST = ("Ada", "Bruno", "Chen", "Dana", "Emil", "Farah", "Goran", "Hana", "Ivo", "Jun", "Kira", "Luis", "Mia",
         "Nils", "Olga", "Pavel", "Quinn", "Rosa", "Sami", "Tara", "Uma", "Viktor", "Wen", "Yara", "Zoe")
LAST = ("Adler", "Berg", "Costa", "Diaz", "Eriksen", "Fischer", "Garcia", "Horvat", "Ito", "Jensen", "Kowalski",
        "Lopez", "Moreau", "Novak", "Olsen", "Petrov", "Rossi", "Silva", "Tanaka", "Weber")
CITIES = ("Berlin", "Lisbon", "Osaka", "Toronto", "Nairobi", "Lima")


@dataclass(frozen=True)
class Schema:
    db_id: str
    ddl: tuple[str, ...]
    rows: Callable[[random.Random], Rows]


def _names(rng: random.Random, n: int) -> list[str]:
    pool = [f"{first} {last}" for first in FIRST for last in LAST]
    return rng.sample(pool, n)


def company_rows(rng: random.Random) -> Rows:
    departments = [(1, "Engineering", "Berlin"), (2, "Sales", "Lisbon"), (3, "Research", "Berlin"),
                   (4, "Support", "Toronto"), (5, "Legal", "Osaka"), (6, "Design", "Lisbon")]
    salaries = rng.sample(range(38_000, 160_000, 250), 60)
    employees = []
    for i, name in enumerate(_names(rng, 60), start=1):
        dept = rng.randint(1, 6)
        manager = None if i <= 6 else rng.randint(1, 6)
        employees.append((i, name, dept, salaries[i - 1], rng.randint(2012, 2024), manager))
    projects = [(i, f"Project {w}", rng.choice([1, 2, 3, 4, 6]), rng.randrange(10_000, 500_000, 1_000))
                for i, w in enumerate(("Atlas", "Beacon", "Comet", "Delta", "Ember", "Falcon", "Glacier",
                                       "Harbor", "Iris", "Juniper"), start=1)]
    pairs = sorted(rng.sample([(e, p) for e in range(1, 61) for p in range(1, 11)], 150))
    assignments = [(e, p, rng.randint(4, 60)) for e, p in pairs]
    return {"departments": departments, "employees": employees, "projects": projects, "assignments": assignments}


def library_rows(rng: random.Random) -> Rows:
    countries = ("Canada", "Japan", "Brazil", "Norway", "Kenya")
    authors = [(i, name, rng.choice(countries)) for i, name in enumerate(_names(rng, 25), start=1)]
    genres = ("Poetry", "Mystery", "History", "Science", "Fantasy")
    words = ("Silent", "River", "Glass", "Winter", "Garden", "Iron", "Paper", "Moon", "Salt", "Echo", "Stone",
             "Harbor", "Lantern", "Orchard", "Thunder")
    titles = rng.sample([f"The {a} {b}" for a in words for b in words if a != b], 120)
    books = [(i, title, rng.randint(1, 25), rng.choice(genres), rng.randint(1890, 2023), rng.randint(80, 900))
             for i, title in enumerate(titles, start=1)]
    members = [(i, name, rng.randint(2010, 2024)) for i, name in enumerate(_names(rng, 40), start=1)]
    loans = []
    for i in range(1, 301):
        day = f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        loans.append((i, rng.randint(1, 110), rng.randint(1, 40), day, int(rng.random() < 0.8)))
    return {"authors": authors, "books": books, "members": members, "loans": loans}


def shop_rows(rng: random.Random) -> Rows:
    customers = [(i, name, rng.choice(CITIES)) for i, name in enumerate(_names(rng, 50), start=1)]
    categories = ("Books", "Garden", "Kitchen", "Toys", "Audio")
    prices = rng.sample(range(199, 49_999, 7), 40)
    products = [(i, f"{categories[i % 5]} item {i}", categories[i % 5], prices[i - 1] / 100) for i in range(1, 41)]
    orders, items = [], []
    statuses = ("shipped", "pending", "cancelled", "delivered")
    for i in range(1, 201):
        orders.append((i, rng.randint(1, 45), f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
                       rng.choice(statuses)))
        for product in rng.sample(range(1, 41), rng.randint(1, 4)):
            items.append((i, product, rng.randint(1, 5)))
    return {"customers": customers, "products": products, "orders": orders, "order_items": items}


def flights_rows(rng: random.Random) -> Rows:
    airports = [("LIS", "Lisbon", "Portugal"), ("OPO", "Porto", "Portugal"), ("BER", "Berlin", "Germany"),
                ("MUC", "Munich", "Germany"), ("KIX", "Osaka", "Japan"), ("HND", "Tokyo", "Japan"),
                ("YYZ", "Toronto", "Canada"), ("NBO", "Nairobi", "Kenya")]
    airlines = [(1, "Aurora Air"), (2, "Blue Heron"), (3, "Cirrus Lines"), (4, "Dune Jet"), (5, "Eagle Wings")]
    codes = [a[0] for a in airports]
    flights = []
    for i in range(1, 401):
        origin, destination = rng.sample(codes, 2)
        delay = 0 if rng.random() < 0.5 else rng.randint(1, 180)
        flights.append((i, rng.randint(1, 5), origin, destination, rng.randint(200, 9_000), delay,
                        f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"))
    return {"airports": airports, "airlines": airlines, "flights": flights}


SCHEMAS = (
    Schema("company", (
        "CREATE TABLE departments (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT NOT NULL)",
        "CREATE TABLE employees (id INTEGER PRIMARY KEY, name TEXT NOT NULL, dept_id INTEGER NOT NULL "
        "REFERENCES departments(id), salary INTEGER NOT NULL, hire_year INTEGER NOT NULL, manager_id INTEGER)",
        "CREATE TABLE projects (id INTEGER PRIMARY KEY, name TEXT NOT NULL, dept_id INTEGER NOT NULL "
        "REFERENCES departments(id), budget INTEGER NOT NULL)",
        "CREATE TABLE assignments (employee_id INTEGER NOT NULL REFERENCES employees(id), project_id INTEGER "
        "NOT NULL REFERENCES projects(id), hours INTEGER NOT NULL)",
    ), company_rows),
    Schema("library", (
        "CREATE TABLE authors (id INTEGER PRIMARY KEY, name TEXT NOT NULL, country TEXT NOT NULL)",
        "CREATE TABLE books (id INTEGER PRIMARY KEY, title TEXT NOT NULL, author_id INTEGER NOT NULL "
        "REFERENCES authors(id), genre TEXT NOT NULL, year INTEGER NOT NULL, pages INTEGER NOT NULL)",
        "CREATE TABLE members (id INTEGER PRIMARY KEY, name TEXT NOT NULL, joined_year INTEGER NOT NULL)",
        "CREATE TABLE loans (id INTEGER PRIMARY KEY, book_id INTEGER NOT NULL REFERENCES books(id), member_id "
        "INTEGER NOT NULL REFERENCES members(id), loan_date TEXT NOT NULL, returned INTEGER NOT NULL)",
    ), library_rows),
    Schema("shop", (
        "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT NOT NULL)",
        "CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL, "
        "price DOUBLE NOT NULL)",
        "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL, order_date TEXT NOT NULL, "
        "status TEXT NOT NULL)",
        "CREATE TABLE order_items (order_id INTEGER NOT NULL REFERENCES orders(id), product_id INTEGER NOT NULL "
        "REFERENCES products(id), quantity INTEGER NOT NULL)",
    ), shop_rows),
    Schema("flights", (
        "CREATE TABLE airports (code TEXT PRIMARY KEY, city TEXT NOT NULL, country TEXT NOT NULL)",
        "CREATE TABLE airlines (id INTEGER PRIMARY KEY, name TEXT NOT NULL)",
        "CREATE TABLE flights (id INTEGER PRIMARY KEY, airline_id INTEGER NOT NULL REFERENCES airlines(id), "
        "origin TEXT NOT NULL REFERENCES airports(code), destination TEXT NOT NULL REFERENCES airports(code), "
        "distance INTEGER NOT NULL, delay_minutes INTEGER NOT NULL, day TEXT NOT NULL)",
    ), flights_rows),
)
