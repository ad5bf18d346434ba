# The drivers: review.py knows the stage order of a review; review_cache.py and incremental.py decide
# what an earlier review serves; commands.py runs the other commands; baseline.py and waivers.py judge
# a review's findings against an earlier review and accepted findings.
