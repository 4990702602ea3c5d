import urllib.request

urllib.request.urlopen("http://localhost:8000/health", timeout=2).read()
