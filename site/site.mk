# The book. Included by the main Makefile (`-include site/site.mk`); see site/README.md.
#
#   make site        chapters/ -> build/docs/ -> build/site/ (diagrams run, notebooks executed,
#                    claims measured, mkdocs --strict); a whole build that succeeds records the
#                    state of its inputs in build/site.stamp
#   make site-test   every page opened in headless Chromium; screenshots in
#                    build/site-screenshots/. It builds the book first unless build/site.stamp
#                    matches the inputs as they are now (`build_book.py --fresh`), so after
#                    `make site` it only runs the browser, and on a fresh clone (CI) it builds
#                    once. `make -n site-test` runs that check too (it is a $(MAKE) line) and
#                    shows whether a build would follow.
.PHONY: site site-test

CHROMIUM ?= /usr/bin/chromium

site: setup ## build the book into build/site (mkdocs --strict) and record build/site.stamp
	NO_MKDOCS_2_WARNING=1 $(PY) site/build_book.py

site-test: setup $(CHROMIUM) ## every page in headless Chromium; builds the book first unless build/site.stamp says it is current
	@$(PY) site/build_book.py --fresh || $(MAKE) --no-print-directory site
	$(PY) site/browser_check.py --chromium $(CHROMIUM)

$(CHROMIUM):
	apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium
