"""Questions over the built-in databases, with gold SQL and a difficulty label.

Queries that rank rows (ORDER BY ... LIMIT) rank unique values or break ties by id, so each
question has exactly one right result.
"""

from __future__ import annotations

from typing import NamedTuple


class Question(NamedTuple):
    db_id: str
    difficulty: str
    question: str
    sql: str
    external_knowledge: str = ""


QUESTIONS: tuple[Question, ...] = (
    # -- company ----------------------------------------------------------------------------------
    Question("company", "easy", "How many employees are there?", "SELECT COUNT(*) FROM employees"),
    Question("company", "easy", "List the names of the departments located in Berlin.",
             "SELECT name FROM departments WHERE city = 'Berlin'"),
    Question("company", "medium", "For each department, give its name and the average salary of its employees, "
             "rounded to 2 decimals.",
             "SELECT d.name, ROUND(AVG(e.salary), 2) FROM employees e JOIN departments d ON e.dept_id = d.id "
             "GROUP BY d.name"),
    Question("company", "medium", "Which 3 employees earn the most? Give name and salary, highest salary first.",
             "SELECT name, salary FROM employees ORDER BY salary DESC LIMIT 3"),
    Question("company", "medium", "How many employees were hired in 2020 or later in each department? "
             "Give the department name and the count; leave out departments with none.",
             "SELECT d.name, COUNT(*) FROM employees e JOIN departments d ON e.dept_id = d.id "
             "WHERE e.hire_year >= 2020 GROUP BY d.name"),
    Question("company", "hard", "Names of the employees who earn more than the average salary of their own "
             "department.",
             "SELECT e.name FROM employees e WHERE e.salary > (SELECT AVG(x.salary) FROM employees x "
             "WHERE x.dept_id = e.dept_id)"),
    Question("company", "hard", "Which departments have no projects? Give their names.",
             "SELECT name FROM departments WHERE id NOT IN (SELECT dept_id FROM projects)"),
    Question("company", "hard", "For each project with more than 100 assigned hours in total, give the project "
             "name and the total hours, largest total first (ties by project name).",
             "SELECT p.name, SUM(a.hours) AS total FROM assignments a JOIN projects p ON a.project_id = p.id "
             "GROUP BY p.name HAVING SUM(a.hours) > 100 ORDER BY total DESC, p.name"),
    # -- library ----------------------------------------------------------------------------------
    Question("library", "easy", "How many books were published before 1950?",
             "SELECT COUNT(*) FROM books WHERE year < 1950"),
    Question("library", "easy", "List the titles of the books in the genre Poetry.",
             "SELECT title FROM books WHERE genre = 'Poetry'"),
    Question("library", "medium", "How many books are there in each genre? Give genre and count.",
             "SELECT genre, COUNT(*) FROM books GROUP BY genre"),
    Question("library", "medium", "Names of the authors from Norway who have at least one book in the library.",
             "SELECT DISTINCT a.name FROM authors a JOIN books b ON b.author_id = a.id WHERE a.country = 'Norway'"),
    Question("library", "medium", "How many loans have not been returned yet?",
             "SELECT COUNT(*) FROM loans WHERE returned = 0",
             "A loan is returned when its returned flag is 1."),
    Question("library", "hard", "Titles of the books that have never been loaned.",
             "SELECT title FROM books WHERE id NOT IN (SELECT book_id FROM loans)"),
    Question("library", "hard", "For authors with more than 4 books, give the author name and the average page "
             "count of their books rounded to 1 decimal.",
             "SELECT a.name, ROUND(AVG(b.pages), 1) FROM authors a JOIN books b ON b.author_id = a.id "
             "GROUP BY a.id, a.name HAVING COUNT(*) > 4"),
    Question("library", "hard", "Titles of the books currently on loan whose author is from Japan.",
             "SELECT DISTINCT b.title FROM loans l JOIN books b ON l.book_id = b.id JOIN authors a "
             "ON b.author_id = a.id WHERE l.returned = 0 AND a.country = 'Japan'",
             "A book is on loan when one of its loans has returned = 0."),
    # -- shop -------------------------------------------------------------------------------------
    Question("shop", "easy", "How many products cost more than 100?", "SELECT COUNT(*) FROM products WHERE price > 100"),
    Question("shop", "easy", "Names of the customers who live in Lisbon.",
             "SELECT name FROM customers WHERE city = 'Lisbon'"),
    Question("shop", "medium", "How many orders are there for each status? Give status and count.",
             "SELECT status, COUNT(*) FROM orders GROUP BY status"),
    Question("shop", "medium", "Total revenue per product category, rounded to 2 decimals: category and revenue.",
             "SELECT p.category, ROUND(SUM(p.price * i.quantity), 2) FROM order_items i JOIN products p "
             "ON i.product_id = p.id GROUP BY p.category",
             "Revenue of an order line is the product price times the quantity; cancelled orders count too."),
    Question("shop", "medium", "The most expensive product of each category: category, product name and price.",
             "SELECT p.category, p.name, p.price FROM products p WHERE p.price = (SELECT MAX(q.price) "
             "FROM products q WHERE q.category = p.category)"),
    Question("shop", "hard", "Names of the customers who have never placed an order.",
             "SELECT c.name FROM customers c LEFT JOIN orders o ON o.customer_id = c.id WHERE o.id IS NULL"),
    Question("shop", "hard", "The 5 customers who spent the most on orders that were not cancelled: name and "
             "total rounded to 2 decimals, biggest spender first.",
             "SELECT c.name, ROUND(SUM(p.price * i.quantity), 2) AS total FROM customers c JOIN orders o "
             "ON o.customer_id = c.id JOIN order_items i ON i.order_id = o.id JOIN products p "
             "ON p.id = i.product_id WHERE o.status <> 'cancelled' GROUP BY c.id, c.name "
             "ORDER BY total DESC, c.id LIMIT 5"),
    Question("shop", "hard", "Number of orders in each month, as YYYY-MM and count, in month order.",
             "SELECT substr(order_date, 1, 7) AS month, COUNT(*) FROM orders GROUP BY month ORDER BY month",
             "order_date is text in the form YYYY-MM-DD."),
    # -- flights ----------------------------------------------------------------------------------
    Question("flights", "easy", "How many flights depart from the airport LIS?",
             "SELECT COUNT(*) FROM flights WHERE origin = 'LIS'"),
    Question("flights", "easy", "List the names of all airlines.", "SELECT name FROM airlines"),
    Question("flights", "medium", "Average delay in minutes per airline, rounded to 1 decimal: airline name and "
             "average delay.",
             "SELECT a.name, ROUND(AVG(f.delay_minutes), 1) FROM flights f JOIN airlines a ON f.airline_id = a.id "
             "GROUP BY a.name"),
    Question("flights", "medium", "How many flights depart from each country? Give country and count.",
             "SELECT p.country, COUNT(*) FROM flights f JOIN airports p ON f.origin = p.code GROUP BY p.country"),
    Question("flights", "medium", "The longest flight distance of each airline: airline name and distance.",
             "SELECT a.name, MAX(f.distance) FROM flights f JOIN airlines a ON f.airline_id = a.id GROUP BY a.name"),
    Question("flights", "hard", "Routes (origin and destination codes) flown by more than 2 different airlines.",
             "SELECT origin, destination FROM flights GROUP BY origin, destination "
             "HAVING COUNT(DISTINCT airline_id) > 2"),
    Question("flights", "hard", "For each airline, the share of its flights delayed by more than 30 minutes, "
             "rounded to 3 decimals, highest share first: airline name and share.",
             "SELECT a.name, ROUND(SUM(CASE WHEN f.delay_minutes > 30 THEN 1 ELSE 0 END) * 1.0 / COUNT(*), 3) "
             "AS share FROM flights f JOIN airlines a ON f.airline_id = a.id GROUP BY a.name "
             "ORDER BY share DESC, a.name"),
    Question("flights", "hard", "Cities whose airport has more departing than arriving flights.",
             "SELECT p.city FROM airports p WHERE (SELECT COUNT(*) FROM flights f WHERE f.origin = p.code) > "
             "(SELECT COUNT(*) FROM flights f WHERE f.destination = p.code)"),
)
