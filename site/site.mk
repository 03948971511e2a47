# The book. Included by the main Makefile (`-include site/site.mk`); see site/README.md.
#
#   make site        chapters/ -> build/docs/ -> build/site/ (diagrams run, notebooks executed,
#                    claims measured, mkdocs --strict)
#   make site-test   the above, then every page opened in headless Chromium; screenshots in
#                    build/site-screenshots/
.PHONY: site site-test

CHROMIUM ?= /usr/bin/chromium

site: setup ## build the book into build/site (mkdocs --strict)
	NO_MKDOCS_2_WARNING=1 $(PY) site/build_book.py

site-test: site $(CHROMIUM) ## build the book and open every page in headless Chromium
	$(PY) site/browser_check.py --chromium $(CHROMIUM)

$(CHROMIUM):
	apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium
