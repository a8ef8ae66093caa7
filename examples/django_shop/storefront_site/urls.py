from django.urls import path
from storefront import views

urlpatterns = [path("orders", views.place_order)]
